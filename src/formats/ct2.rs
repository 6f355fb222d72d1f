//! CTranslate2 `model.bin`: a flat list of named tensors plus aliases, as
//! written by `ctranslate2.specs.ModelSpec._serialize` (binary versions 4-6).
//!
//! Layout, little-endian throughout:
//! ```text
//! u32 binary_version
//! string spec_name, u32 spec_revision          (strings: u16 length incl. NUL, bytes, NUL)
//! u32 n_variables
//!   n x { string name, u8 rank, u32 dims[rank], u8 dtype, u32 n_bytes, bytes }
//! u32 n_aliases
//!   n x { string alias, string target }
//! ```
//! dtype ids follow CTranslate2's `DataType`: f32, i8, i16, i32, f16, bf16.
//! Quantised weights (`.../weight` as i8 or i16) come with `.../weight_scale`:
//! per output row for i8, one scalar for i16; the float value is `q / scale`.

use crate::error::{Error, Result};
use half::{bf16, f16};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Element type of a stored variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl DType {
    fn from_id(id: u8) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::BF16,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
}

/// Where one variable's bytes are in the file.
#[derive(Clone, Debug)]
pub struct Variable {
    pub shape: Vec<usize>,
    pub dtype: DType,
    offset: usize,
    len: usize,
}

impl Variable {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An opened `model.bin`, memory-mapped; tensors are converted on request.
pub struct Ct2File {
    path: PathBuf,
    map: Mmap,
    pub binary_version: u32,
    pub spec_name: String,
    pub spec_revision: u32,
    variables: HashMap<String, Variable>,
    aliases: HashMap<String, String>,
}

/// A bounds-checked little-endian reader over the mapped file.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::format(
                self.path,
                format!(
                    "truncated: {what} needs {n} bytes at offset {} but the file has {}",
                    self.pos,
                    self.bytes.len()
                ),
            ));
        };
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u16(what)? as usize;
        let b = self.take(n, what)?;
        let b = b.strip_suffix(&[0]).ok_or_else(|| {
            Error::format(self.path, format!("{what}: string is not NUL-terminated"))
        })?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::format(self.path, format!("{what}: string is not UTF-8")))
    }
}

impl Ct2File {
    pub fn open(path: impl AsRef<Path>) -> Result<Ct2File> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the mapping is read-only and private to this process; a
        // file changed underneath us could give wrong numbers but not UB in
        // our code, which only reads bytes through bounds-checked slices.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let mut c = Cursor {
            path,
            bytes: &map,
            pos: 0,
        };
        let binary_version = c.u32("binary version")?;
        if !(4..=6).contains(&binary_version) {
            return Err(Error::unsupported(
                path,
                format!(
                    "CTranslate2 binary version {binary_version} (this reader handles 4 to 6; \
                     is this a CTranslate2 model.bin?)"
                ),
            ));
        }
        let spec_name = c.string("spec name")?;
        let spec_revision = c.u32("spec revision")?;
        let n = c.u32("variable count")? as usize;
        // Each variable takes at least 12 bytes: reject absurd counts before
        // reserving room for them.
        if n > map.len() / 12 {
            return Err(Error::format(
                path,
                format!("{n} variables cannot fit in {} bytes", map.len()),
            ));
        }
        let mut variables = HashMap::with_capacity(n);
        for i in 0..n {
            let name = c.string(&format!("variable {i} name"))?;
            let rank = c.u8(&name)? as usize;
            let mut shape = Vec::with_capacity(rank);
            for _ in 0..rank {
                shape.push(c.u32(&name)? as usize);
            }
            let dtype_id = c.u8(&name)?;
            let dtype = DType::from_id(dtype_id).ok_or_else(|| {
                Error::format(path, format!("{name}: unknown dtype id {dtype_id}"))
            })?;
            let len = c.u32(&name)? as usize;
            let numel = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .filter(|&n| n.checked_mul(dtype.size()) == Some(len));
            if numel.is_none() {
                return Err(Error::format(
                    path,
                    format!("{name}: shape {shape:?} of {dtype:?} does not match its {len} bytes"),
                ));
            }
            let offset = c.pos;
            c.take(len, &name)?;
            if variables
                .insert(
                    name.clone(),
                    Variable {
                        shape,
                        dtype,
                        offset,
                        len,
                    },
                )
                .is_some()
            {
                return Err(Error::format(
                    path,
                    format!("variable {name} appears twice"),
                ));
            }
        }
        let n_aliases = c.u32("alias count")? as usize;
        if n_aliases > map.len() / 6 {
            return Err(Error::format(
                path,
                format!("{n_aliases} aliases cannot fit"),
            ));
        }
        let mut aliases = HashMap::with_capacity(n_aliases);
        for i in 0..n_aliases {
            let alias = c.string(&format!("alias {i}"))?;
            let target = c.string(&format!("alias {alias} target"))?;
            if !variables.contains_key(&target) {
                return Err(Error::format(
                    path,
                    format!("alias {alias} points to missing variable {target}"),
                ));
            }
            aliases.insert(alias, target);
        }
        if c.pos != map.len() {
            return Err(Error::format(
                path,
                format!("{} unexpected bytes after the aliases", map.len() - c.pos),
            ));
        }
        Ok(Ct2File {
            path: path.to_path_buf(),
            map,
            binary_version,
            spec_name,
            spec_revision,
            variables,
            aliases,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The variable called `name`, following an alias.
    pub fn variable(&self, name: &str) -> Option<&Variable> {
        let name = self.aliases.get(name).map_or(name, String::as_str);
        self.variables.get(name)
    }

    /// Every variable name (not the aliases), sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.variables.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    fn require(&self, name: &str) -> Result<&Variable> {
        self.variable(name)
            .ok_or_else(|| Error::format(&self.path, format!("missing variable {name}")))
    }

    fn bytes(&self, v: &Variable) -> &[u8] {
        &self.map[v.offset..v.offset + v.len]
    }

    /// `name` as f32 with its shape, checked against `shape`. Half floats are
    /// widened, quantised integers multiplied back by their scale.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.require(name)?;
        if v.shape != shape {
            return Err(Error::format(
                &self.path,
                format!("{name}: shape {:?}, expected {shape:?}", v.shape),
            ));
        }
        let b = self.bytes(v);
        Ok(match v.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::I8 | DType::I16 => self.dequantize(name, v)?,
            DType::I32 => {
                return Err(Error::unsupported(
                    &self.path,
                    format!("{name}: int32 tensors are not weights"),
                ))
            }
        })
    }

    fn dequantize(&self, name: &str, v: &Variable) -> Result<Vec<f32>> {
        let scale_name = format!("{name}_scale");
        let s = self.require(&scale_name)?;
        let rows = v.shape.first().copied().unwrap_or(1);
        let scales = self.f32(&scale_name, &s.shape.clone())?;
        // i8: one scale per output row; i16: one scale for the whole tensor.
        let per_row = match (v.dtype, scales.len()) {
            (DType::I8, n) if n == rows => true,
            (_, 1) => false,
            (_, n) => {
                return Err(Error::format(
                    &self.path,
                    format!("{scale_name}: {n} scales for {rows} rows"),
                ))
            }
        };
        let row_len = v.numel() / rows.max(1);
        let b = self.bytes(v);
        let q: Vec<f32> = match v.dtype {
            DType::I8 => b.iter().map(|&x| x as i8 as f32).collect(),
            _ => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32)
                .collect(),
        };
        Ok(q.iter()
            .enumerate()
            .map(|(i, &x)| {
                let s = if per_row {
                    scales[i / row_len]
                } else {
                    scales[0]
                };
                x / s
            })
            .collect())
    }

    /// A scalar integer attribute (`encoder/num_heads`, ...).
    pub fn scalar_i64(&self, name: &str) -> Result<i64> {
        let v = self.require(name)?;
        let b = self.bytes(v);
        if v.numel() != 1 {
            return Err(Error::format(
                &self.path,
                format!("{name}: expected a scalar, shape {:?}", v.shape),
            ));
        }
        Ok(match v.dtype {
            DType::I8 => b[0] as i8 as i64,
            DType::I16 => i16::from_le_bytes([b[0], b[1]]) as i64,
            DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            _ => {
                return Err(Error::format(
                    &self.path,
                    format!("{name}: expected an integer, found {:?}", v.dtype),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u16 + 1).to_le_bytes());
        out.extend(s.as_bytes());
        out.push(0);
    }

    fn var(out: &mut Vec<u8>, name: &str, shape: &[u32], dtype: u8, data: &[u8]) {
        string(out, name);
        out.push(shape.len() as u8);
        for d in shape {
            out.extend(d.to_le_bytes());
        }
        out.push(dtype);
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
    }

    fn file(body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(6u32.to_le_bytes());
        string(&mut out, "TestSpec");
        out.extend(1u32.to_le_bytes());
        body(&mut out);
        out
    }

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("lfm-ct2-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_every_dtype_and_alias() {
        let halves: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect();
        let floats: Vec<u8> = [0.25f32, 4.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let bytes = file(|o| {
            o.extend(5u32.to_le_bytes());
            var(o, "a/weight", &[2, 1], 4, &halves);
            var(o, "b", &[2], 0, &floats);
            var(o, "q/weight", &[2, 2], 1, &[2u8, (-4i8) as u8, 10, 20]);
            var(o, "q/weight_scale", &[2], 0, &floats);
            var(o, "heads", &[], 2, &6i16.to_le_bytes());
            o.extend(1u32.to_le_bytes());
            string(o, "alias");
            string(o, "b");
        });
        let p = write("ok", &bytes);
        let f = Ct2File::open(&p).unwrap();
        assert_eq!(f.spec_name, "TestSpec");
        assert_eq!(f.f32("a/weight", &[2, 1]).unwrap(), vec![1.5, -2.0]);
        assert_eq!(f.f32("alias", &[2]).unwrap(), vec![0.25, 4.0]);
        assert_eq!(
            f.f32("q/weight", &[2, 2]).unwrap(),
            vec![8.0, -16.0, 2.5, 5.0]
        );
        assert_eq!(f.scalar_i64("heads").unwrap(), 6);
        assert!(f.f32("b", &[3]).is_err(), "wrong shape must be refused");
        assert!(f.f32("missing", &[1]).is_err());
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn refuses_truncated_and_inconsistent_files() {
        let good = file(|o| {
            o.extend(1u32.to_le_bytes());
            var(o, "b", &[2], 0, &[0; 8]);
            o.extend(0u32.to_le_bytes());
        });
        for cut in [0, 3, 10, good.len() - 5, good.len() - 1] {
            let p = write(&format!("cut{cut}"), &good[..cut]);
            let e = Ct2File::open(&p).err().expect("truncated file accepted");
            assert!(e.to_string().contains(&*p.to_string_lossy()), "{e}");
            std::fs::remove_file(p).unwrap();
        }
        let bad_shape = file(|o| {
            o.extend(1u32.to_le_bytes());
            var(o, "b", &[3], 0, &[0; 8]);
            o.extend(0u32.to_le_bytes());
        });
        let p = write("shape", &bad_shape);
        assert!(Ct2File::open(&p).is_err());
        std::fs::remove_file(p).unwrap();
        let huge_count = file(|o| o.extend(u32::MAX.to_le_bytes()));
        let p = write("count", &huge_count);
        assert!(Ct2File::open(&p).is_err());
        std::fs::remove_file(p).unwrap();
    }
}
