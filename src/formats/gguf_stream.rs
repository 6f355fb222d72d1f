//! A GGUF v3 file written one tensor at a time, so that a tool converting a
//! checkpoint (`gguf-write`, `quantize`) holds only the tensor it is working
//! on: the header (metadata, then every tensor's name, type, shape and
//! offset) goes out first, then each tensor's bytes in the declared order.
//!
//! The file is an [`AtomicFile`]: a failed write (a full disk) or an
//! unfinished writer removes the temporary file and leaves an existing output
//! untouched; [`GgufStreamWriter::finish`] renames it into place.

use super::gguf::{encode_str, encode_value, Value, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::error::{Error, Result};
use crate::quant::GgmlType;
use crate::tensor::tensor_bytes;
use crate::util::atomic_write::AtomicFile;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A tensor the file will hold: declared up front, written later.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDecl {
    pub name: String,
    pub dtype: GgmlType,
    /// Outermost first, as [`crate::tensor::Tensor`].
    pub shape: Vec<usize>,
}

pub struct GgufStreamWriter {
    path: PathBuf,
    file: AtomicFile,
    align: usize,
    /// (name, byte size) of every declared tensor, in file order.
    sizes: Vec<(String, usize)>,
    next: usize,
    zeros: Vec<u8>,
}

impl GgufStreamWriter {
    /// Creates `path` (refused when it exists, unless `overwrite`) and writes
    /// the header for `metadata` and `tensors`.
    pub fn create(
        path: &Path,
        overwrite: bool,
        metadata: &[(String, Value)],
        tensors: &[TensorDecl],
    ) -> Result<Self> {
        let align = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => *a as usize,
            Some((_, v)) => {
                return Err(Error::invalid(format!(
                    "general.alignment must be a u32 power of two, got {v:?}"
                )))
            }
        };
        let mut sizes: Vec<(String, usize)> = Vec::with_capacity(tensors.len());
        for t in tensors {
            if sizes.iter().any(|(n, _)| *n == t.name) {
                return Err(Error::invalid(format!(
                    "tensor '{}' declared twice",
                    t.name
                )));
            }
            if t.shape.is_empty() || t.shape.len() > MAX_DIMS || t.shape.contains(&0) {
                return Err(Error::invalid(format!(
                    "tensor '{}': GGUF needs 1 to {MAX_DIMS} non-zero dimensions, got {:?}",
                    t.name, t.shape
                )));
            }
            let size = tensor_bytes(t.dtype, &t.shape)
                .map_err(|e| Error::invalid(format!("tensor '{}': {e}", t.name)))?;
            sizes.push((t.name.clone(), size));
        }

        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            encode_str(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            encode_value(&mut head, v);
        }
        let mut offset = 0usize;
        for (t, (_, size)) in tensors.iter().zip(&sizes) {
            encode_str(&mut head, &t.name);
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            head.extend_from_slice(&t.dtype.id().to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + size).next_multiple_of(align);
        }

        let mut w = GgufStreamWriter {
            path: path.to_path_buf(),
            file: AtomicFile::create(path, overwrite)?,
            align,
            sizes,
            next: 0,
            zeros: vec![0u8; align],
        };
        w.put(&head)?;
        Ok(w)
    }

    /// Writes `bytes` and the padding after them.
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        let pad = bytes.len().next_multiple_of(self.align) - bytes.len();
        let w = self.file.writer();
        w.write_all(bytes)
            .and_then(|()| w.write_all(&self.zeros[..pad]))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// The name of the tensor [`GgufStreamWriter::write_tensor`] expects next.
    pub fn next_name(&self) -> Option<&str> {
        self.sizes.get(self.next).map(|(n, _)| n.as_str())
    }

    /// Writes the data of the next declared tensor, which must be `name`
    /// and exactly its declared size.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some((want, size)) = self.sizes.get(self.next) else {
            return Err(Error::invalid(format!(
                "tensor '{name}' written after all {} declared tensors",
                self.sizes.len()
            )));
        };
        if want != name || *size != bytes.len() {
            return Err(Error::invalid(format!(
                "tensor '{name}' ({} bytes) written where '{want}' ({size} bytes) was declared",
                bytes.len()
            )));
        }
        self.put(bytes)?;
        self.next += 1;
        Ok(())
    }

    /// Publishes the file once every declared tensor has been written.
    pub fn finish(self) -> Result<()> {
        if let Some(name) = self.next_name() {
            return Err(Error::invalid(format!(
                "{}: tensor '{name}' was declared but never written",
                self.path.display()
            )));
        }
        self.file.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::gguf::{GgufFile, GgufWriter};
    use crate::formats::TensorSource;
    use crate::tensor::Tensor;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("lfm-gguf-stream-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn tensors() -> Vec<Tensor> {
        let a: Vec<f32> = (0..96).map(|i| i as f32 * 0.25 - 3.0).collect();
        vec![
            Tensor::quantize_f32("a", vec![3, 32], &a, GgmlType::Q8_0).unwrap(),
            Tensor::from_f32("b", vec![5], vec![1.0, 2.0, 3.0, 4.0, 5.0]),
        ]
    }

    #[test]
    fn streams_the_same_bytes_as_the_in_memory_writer() {
        let dir = scratch("same");
        let meta = vec![
            ("general.architecture".to_string(), Value::from("llama")),
            ("general.alignment".to_string(), Value::U32(64)),
        ];
        let mut whole = GgufWriter::new();
        for (k, v) in &meta {
            whole.set(k.clone(), v.clone()).unwrap();
        }
        let decls: Vec<TensorDecl> = tensors()
            .iter()
            .map(|t| TensorDecl {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect();
        let mut s = GgufStreamWriter::create(&dir.join("s.gguf"), false, &meta, &decls).unwrap();
        for t in tensors() {
            assert_eq!(s.next_name(), Some(t.name.as_str()));
            s.write_tensor(&t.name, t.bytes()).unwrap();
            whole.add_tensor(t).unwrap();
        }
        s.finish().unwrap();
        whole.write(&dir.join("w.gguf"), false).unwrap();
        let (s, w) = (
            std::fs::read(dir.join("s.gguf")).unwrap(),
            std::fs::read(dir.join("w.gguf")).unwrap(),
        );
        assert_eq!(s, w);
        let g = GgufFile::open(dir.join("s.gguf")).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(
            g.tensor("b").unwrap().to_f32(),
            vec![1.0, 2.0, 3.0, 4.0, 5.0]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_order_size_or_missing_tensors_are_refused_and_leave_nothing() {
        let dir = scratch("refuse");
        let path = dir.join("x.gguf");
        let decls = vec![TensorDecl {
            name: "w".into(),
            dtype: GgmlType::F32,
            shape: vec![2],
        }];
        let mut s = GgufStreamWriter::create(&path, false, &[], &decls).unwrap();
        assert!(s.write_tensor("v", &[0; 8]).is_err());
        assert!(s.write_tensor("w", &[0; 4]).is_err());
        let e = s.finish().unwrap_err();
        assert!(e.to_string().contains("never written"), "{e}");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "temporary file left"
        );
        let bad = vec![TensorDecl {
            name: "q".into(),
            dtype: GgmlType::Q4_0,
            shape: vec![2, 31],
        }];
        assert!(GgufStreamWriter::create(&path, false, &[], &bad).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
