//! safetensors: an 8-byte little-endian header length, a JSON header mapping
//! each tensor name to `{dtype, shape, data_offsets: [begin, end]}` (offsets
//! relative to the end of the header), then the data.
//!
//! The header is parsed here rather than by the `safetensors` crate so that
//! every complaint names the file and the tensor. F32, F16 and BF16 tensors
//! map to [`GgmlType`] without conversion; a tensor of any other dtype can be
//! listed but reading it is [`Error::Unsupported`]. A sharded HF checkpoint
//! (`model.safetensors.index.json` with its `weight_map`) reads as one source.

use super::{missing_tensor, TensorSource};
use crate::error::{Error, Result};
use crate::quant::GgmlType;
use crate::tensor::{SharedBytes, Tensor};
use crate::util::fs;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Headers larger than this are refused before they are read (the
/// `safetensors` crate uses the same limit).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Bytes per element of every safetensors dtype with a whole-byte size.
fn dtype_bytes(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

fn ggml_type(dtype: &str) -> Option<GgmlType> {
    match dtype {
        "F32" => Some(GgmlType::F32),
        "F16" => Some(GgmlType::F16),
        "BF16" => Some(GgmlType::BF16),
        _ => None,
    }
}

#[derive(Clone, Debug)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// One memory-mapped `.safetensors` file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: SharedBytes,
    names: Vec<String>,
    entries: HashMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        // Memory-mapped natively; in a browser tab, the bytes the page gave.
        let map = crate::util::fs::map(path).map_err(|e| Error::io(path, e))?;
        let len = (*map).as_ref().len();
        if len < 8 {
            return Err(Error::format(
                path,
                format!("{len} bytes is too short for a safetensors file"),
            ));
        }
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: SharedBytes) -> Result<SafetensorsFile> {
        let err = |what: String| Error::format(path, what);
        let shared = map.clone();
        let map: &[u8] = (*shared).as_ref();
        let header_len = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        let avail = map.len() as u64 - 8;
        if header_len > avail || header_len > MAX_HEADER_BYTES {
            return Err(err(format!(
                "header length {header_len} is more than the {avail} bytes after it \
                 (or the {MAX_HEADER_BYTES}-byte limit)"
            )));
        }
        let data_start = 8 + header_len as usize;
        let data_len = map.len() - data_start;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&map[8..data_start])
                .map_err(|e| err(format!("header is not a JSON object: {e}")))?;

        let mut names = Vec::with_capacity(header.len());
        let mut entries = HashMap::with_capacity(header.len());
        let mut metadata = BTreeMap::new();
        for (name, v) in &header {
            if name == "__metadata__" {
                let obj = v
                    .as_object()
                    .ok_or_else(|| err("__metadata__ is not an object".into()))?;
                for (k, v) in obj {
                    let s = v.as_str().ok_or_else(|| {
                        err(format!("__metadata__ value of '{k}' is not a string"))
                    })?;
                    metadata.insert(k.clone(), s.to_string());
                }
                continue;
            }
            let bad = |what: &str| err(format!("tensor '{name}': {what}"));
            let obj = v.as_object().ok_or_else(|| bad("entry is not an object"))?;
            let dtype = obj
                .get("dtype")
                .and_then(|d| d.as_str())
                .ok_or_else(|| bad("missing or non-string dtype"))?;
            let shape = obj
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("missing or non-array shape"))?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| bad("shape holds something other than non-negative integers"))?;
            let offsets = obj
                .get("data_offsets")
                .and_then(|o| o.as_array())
                .filter(|o| o.len() == 2)
                .and_then(|o| Some((o[0].as_u64()?, o[1].as_u64()?)))
                .ok_or_else(|| bad("data_offsets is not two non-negative integers"))?;
            let (begin, end) = offsets;
            if begin > end || end > data_len as u64 {
                return Err(bad(&format!(
                    "data_offsets [{begin}, {end}] lie outside the {data_len} data bytes"
                )));
            }
            // Zero dimensions are ignored here so that an empty tensor cannot
            // carry a dimension whose row size overflows.
            let elem = dtype_bytes(dtype).unwrap_or(1);
            shape
                .iter()
                .try_fold(elem, |acc, &d| acc.checked_mul(d.max(1)))
                .ok_or_else(|| bad(&format!("shape {shape:?} overflows")))?;
            if let Some(elem) = dtype_bytes(dtype) {
                let size: usize = elem * shape.iter().product::<usize>();
                if size as u64 != end - begin {
                    return Err(bad(&format!(
                        "{dtype} {shape:?} is {size} bytes but data_offsets [{begin}, {end}] \
                         span {}",
                        end - begin
                    )));
                }
            }
            names.push(name.clone());
            entries.insert(
                name.clone(),
                Entry {
                    dtype: dtype.to_string(),
                    shape,
                    start: data_start + begin as usize,
                    end: data_start + end as usize,
                },
            );
        }
        // JSON objects are unordered; list tensors in data order.
        names.sort_by_key(|n| (entries[n].start, n.clone()));
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map: shared,
            names,
            entries,
            metadata,
        })
    }

    /// The `__metadata__` strings of the header.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The safetensors dtype name of a tensor ("F32", "I64", ...).
    pub fn dtype(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(|e| e.dtype.as_str())
    }
}

impl TensorSource for SafetensorsFile {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| missing_tensor(&self.path, name))?;
        let dtype = ggml_type(&e.dtype).ok_or_else(|| {
            Error::unsupported(
                &self.path,
                format!(
                    "tensor '{name}' has dtype {} (lfm reads F32, F16 and BF16)",
                    e.dtype
                ),
            )
        })?;
        Ok(Tensor::mapped(
            name.to_string(),
            dtype,
            e.shape.clone(),
            self.map.clone(),
            e.start,
            e.end - e.start,
        ))
    }

    fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// One safetensors file or a set of shards behind an index.
pub struct Safetensors {
    path: PathBuf,
    shards: Vec<SafetensorsFile>,
    /// Tensor name -> shard, in index order.
    names: Vec<String>,
    shard_of: HashMap<String, usize>,
}

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

impl Safetensors {
    /// `path` is a `.safetensors` file, a `*.safetensors.index.json`, or a
    /// directory holding `model.safetensors` or `model.safetensors.index.json`.
    pub fn open(path: impl AsRef<Path>) -> Result<Safetensors> {
        let path = path.as_ref();
        if fs::is_dir(path) {
            let single = path.join(SINGLE_FILE);
            let index = path.join(INDEX_FILE);
            if fs::is_file(&single) {
                return Self::single(path, SafetensorsFile::open(&single)?);
            }
            if fs::is_file(&index) {
                return Self::sharded(path, &index);
            }
            return Err(Error::format(
                path,
                format!("no weights: neither {SINGLE_FILE} nor {INDEX_FILE} is here"),
            ));
        }
        if path.to_string_lossy().ends_with(".json") {
            return Self::sharded(path, path);
        }
        Self::single(path, SafetensorsFile::open(path)?)
    }

    fn single(path: &Path, file: SafetensorsFile) -> Result<Safetensors> {
        let names = file.names.clone();
        let shard_of = names.iter().map(|n| (n.clone(), 0)).collect();
        Ok(Safetensors {
            path: path.to_path_buf(),
            shards: vec![file],
            names,
            shard_of,
        })
    }

    fn sharded(path: &Path, index: &Path) -> Result<Safetensors> {
        let text = fs::read(index).map_err(|e| Error::io(index, e))?;
        let json: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| Error::format(index, format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::format(index, "no \"weight_map\" object"))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shard_files: Vec<String> = Vec::new();
        let mut names = Vec::with_capacity(map.len());
        let mut shard_of = HashMap::with_capacity(map.len());
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                Error::format(
                    index,
                    format!("weight_map entry of '{name}' is not a string"),
                )
            })?;
            // Shards are plain file names beside the index, never paths.
            if file.is_empty() || file.contains(['/', '\\']) || file == ".." || file == "." {
                return Err(Error::format(
                    index,
                    format!("weight_map entry of '{name}' is not a file name: {file:?}"),
                ));
            }
            let shard = match shard_files.iter().position(|f| f == file) {
                Some(i) => i,
                None => {
                    shard_files.push(file.to_string());
                    shard_files.len() - 1
                }
            };
            names.push(name.clone());
            shard_of.insert(name.clone(), shard);
        }
        let shards = shard_files
            .iter()
            .map(|f| SafetensorsFile::open(dir.join(f)))
            .collect::<Result<Vec<_>>>()?;
        for name in &names {
            let shard = &shards[shard_of[name]];
            if !shard.has(name) {
                return Err(Error::format(
                    index,
                    format!(
                        "weight_map puts tensor '{name}' in {}, which does not hold it",
                        shard.path.display()
                    ),
                ));
            }
        }
        Ok(Safetensors {
            path: path.to_path_buf(),
            shards,
            names,
            shard_of,
        })
    }

    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }
}

impl TensorSource for Safetensors {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.shard_of.get(name) {
            Some(&s) => self.shards[s].tensor(name),
            None => Err(missing_tensor(&self.path, name)),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.shard_of.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn path(&self) -> &Path {
        &self.path
    }
}
