//! GGUF, llama.cpp's single-file checkpoint format (versions 2 and 3,
//! little-endian): a header, typed metadata key/values, tensor infos, then
//! the tensor data, each tensor at an offset that is a multiple of
//! `general.alignment` (default 32) from the aligned start of the data.
//!
//! [`GgufFile`] memory-maps a file and checks everything it reads against the
//! bytes that are left: a string or array longer than the rest of the file,
//! an unknown value or tensor type, a zero or overflowing dimension, a row
//! that is not whole blocks, tensor data past the end, all are one-line
//! errors naming the file. [`GgufWriter`] writes version 3 atomically.
//!
//! Tensor shapes are reported outermost-first: ggml's `ne` reversed.

use super::{missing_tensor, TensorSource};
use crate::error::{Error, Result};
use crate::quant::{ggml_type_name, GgmlType};
use crate::tensor::SharedBytes;
use crate::tensor::{tensor_bytes, Tensor};
use crate::util::atomic_write::AtomicFile;
use memmap2::Mmap;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Arrays of arrays deeper than this are refused (a crafted file could
/// otherwise nest until the reader's stack runs out).
const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value type, numbered as in the GGUF spec (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string is
    /// at least its 8-byte length, an array its type and count).
    fn min_bytes(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array: every element has the same type, and an array of
/// arrays holds sub-arrays of any one type each.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened (`None` for floats, bools, strings, arrays).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// An f32 or f64 value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// What this value is, for error messages ("array of string", "u32").
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of an integer array, widened (`None` for other arrays).
    pub fn to_i128s(&self) -> Option<Vec<i128>> {
        fn w<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => w(v),
            Array::I8(v) => w(v),
            Array::U16(v) => w(v),
            Array::I16(v) => w(v),
            Array::U32(v) => w(v),
            Array::I32(v) => w(v),
            Array::U64(v) => w(v),
            Array::I64(v) => w(v),
            _ => return None,
        })
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value { Value::Array(Array::$v(x)) }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

/// Where a tensor lives in a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: GgmlType,
    /// Outermost first (ggml's `ne` reversed).
    pub shape: Vec<usize>,
    /// Byte offset from the start of the data section.
    pub offset: usize,
    /// Byte size of the data.
    pub size: usize,
}

/// A GGUF file, memory-mapped ([`GgufFile::open`]) or in memory
/// ([`GgufFile::from_bytes`]).
pub struct GgufFile {
    path: PathBuf,
    map: SharedBytes,
    version: u32,
    alignment: usize,
    data_offset: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// A cursor over the file's bytes whose every read is bounds-checked and
/// whose errors name the file and the offset.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: impl std::fmt::Display) -> Error {
        Error::format(self.path, what.to_string())
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format_args!(
                "truncated: {what} at byte {} needs {n} bytes, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn std::fmt::Display) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    fn u32(&mut self, what: &dyn std::fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn std::fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items that each take at least `min_bytes`: refused when
    /// the rest of the file cannot hold that many.
    fn count(&mut self, min_bytes: usize, what: &dyn std::fmt::Display) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(min_bytes))
            .is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(self.err(format_args!(
                "{what} at byte {at} is {n}, more than the {} bytes left can hold",
                self.remaining()
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn std::fmt::Display) -> Result<String> {
        let len = self.count(1, &format_args!("length of {what}"))?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| self.err(format_args!("{what} at byte {at} is not valid UTF-8")))
    }

    fn value_type(&mut self, what: &dyn std::fmt::Display) -> Result<ValueType> {
        let at = self.pos;
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| self.err(format_args!("{what} at byte {at}: unknown value type {id}")))
    }

    fn value(&mut self, t: ValueType, what: &dyn std::fmt::Display) -> Result<Value> {
        Ok(match t {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(what, 0)?),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    fn bool(&mut self, what: &dyn std::fmt::Display) -> Result<bool> {
        let at = self.pos;
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(format_args!(
                "{what} at byte {at}: bool value {b} is not 0 or 1"
            ))),
        }
    }

    fn array_value(&mut self, what: &dyn std::fmt::Display, depth: usize) -> Result<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format_args!(
                "{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep"
            )));
        }
        let t = self.value_type(&format_args!("element type of {what}"))?;
        let n = self.count(t.min_bytes(), &format_args!("element count of {what}"))?;
        // `count` bounded n by the bytes left, so these allocations are too.
        macro_rules! fixed {
            ($v:ident, $ty:ty) => {{
                let bytes = self.take(n * std::mem::size_of::<$ty>(), what)?;
                Array::$v(
                    bytes
                        .chunks_exact(std::mem::size_of::<$ty>())
                        .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk size")))
                        .collect(),
                )
            }};
        }
        Ok(match t {
            ValueType::U8 => Array::U8(self.take(n, what)?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(what)?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&format_args!("{what}[{i}]"))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(&format_args!("{what}[{i}]"), depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len < 24 {
            return Err(Error::format(
                path,
                format!("{len} bytes is too short for a GGUF header (24 bytes)"),
            ));
        }
        // SAFETY: the map is read-only and lives as long as every tensor that
        // borrows it; like every mmap reader (llama.cpp, safetensors), we rely
        // on the file not being truncated underneath us.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Self::parse(path, Arc::new(map))
    }

    /// A GGUF file already in memory (a browser tab's fetched bytes); `name`
    /// stands for its path in errors.
    pub fn from_bytes(name: impl AsRef<Path>, bytes: Vec<u8>) -> Result<GgufFile> {
        let path = name.as_ref();
        if bytes.len() < 24 {
            return Err(Error::format(
                path,
                format!(
                    "{} bytes is too short for a GGUF header (24 bytes)",
                    bytes.len()
                ),
            ));
        }
        Self::parse(path, Arc::new(bytes))
    }

    fn parse(path: &Path, map: SharedBytes) -> Result<GgufFile> {
        let mut c = Cursor {
            buf: (*map).as_ref(),
            pos: 0,
            path,
        };
        let magic = c.array::<4>(&"magic")?;
        if &magic != MAGIC {
            return Err(c.err(format_args!(
                "not a GGUF file (magic {:?}, expected \"GGUF\")",
                String::from_utf8_lossy(&magic)
            )));
        }
        let version = c.u32(&"version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(Error::unsupported(
                    path,
                    "GGUF version 1 (re-convert the model with a current llama.cpp)",
                ))
            }
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(Error::unsupported(path, "big-endian GGUF"))
            }
            v => return Err(Error::unsupported(path, format!("GGUF version {v}"))),
        }
        // Smallest tensor info: empty name (8) + n_dims (4) + one dim (8) +
        // type (4) + offset (8); smallest key/value: empty key (8) + type (4)
        // + one byte.
        let n_tensors = c.count(32, &"tensor count")?;
        let n_kv = c.count(13, &"metadata count")?;

        let mut metadata = Vec::with_capacity(n_kv);
        let mut key_index = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = c.string(&format_args!("metadata key #{i}"))?;
            let what = format!("metadata '{key}'");
            let t = c.value_type(&what)?;
            let value = c.value(t, &what)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.err(format_args!("metadata key '{key}' appears twice")));
            }
            metadata.push((key, value));
        }

        let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => *a as usize,
            Some(v) => {
                return Err(c.err(format_args!(
                    "general.alignment must be a u32 power of two, got {} {v:?}",
                    v.describe()
                )))
            }
        };

        let mut raw = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&format_args!("tensor name #{i}"))?;
            let what = format!("tensor '{name}'");
            let n_dims = c.u32(&format_args!("dimension count of {what}"))? as usize;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(format_args!(
                    "{what} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let mut ne = [0u64; MAX_DIMS];
            for d in ne.iter_mut().take(n_dims) {
                *d = c.u64(&format_args!("dimensions of {what}"))?;
            }
            let ne = &ne[..n_dims];
            let type_id = c.u32(&format_args!("type of {what}"))?;
            let offset = c.u64(&format_args!("offset of {what}"))?;
            if ne.contains(&0) {
                return Err(c.err(format_args!("{what} has a zero dimension: ne = {ne:?}")));
            }
            let dtype =
                GgmlType::from_id(type_id).ok_or_else(|| match ggml_type_name(type_id) {
                    Some(n) => Error::unsupported(path, format!("{what} has type {n}")),
                    None => c.err(format_args!("{what} has unknown type id {type_id}")),
                })?;
            let shape: Vec<usize> = ne
                .iter()
                .rev()
                .map(|&d| usize::try_from(d).ok().filter(|&d| d <= i64::MAX as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    c.err(format_args!("{what} has an absurd dimension: ne = {ne:?}"))
                })?;
            let size = tensor_bytes(dtype, &shape)
                .map_err(|e| c.err(format_args!("{what} ({dtype}, ne = {ne:?}): {e}")))?;
            if tensor_index.insert(name.clone(), raw.len()).is_some() {
                return Err(c.err(format_args!("{what} appears twice")));
            }
            raw.push((name, dtype, shape, offset, size));
        }

        let data_offset = c.pos.next_multiple_of(alignment);
        let data_len = (*map).as_ref().len().saturating_sub(data_offset);
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dtype, shape, offset, size) in raw {
            if offset % alignment as u64 != 0 {
                return Err(c.err(format_args!(
                    "tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            let end = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(size));
            if end.is_none_or(|e| e > data_len) {
                return Err(c.err(format_args!(
                    "tensor '{name}' data ({size} bytes at offset {offset}) runs past the end of \
                     the file (data section is {data_len} bytes)"
                )));
            }
            tensors.push(TensorInfo {
                name,
                dtype,
                shape,
                offset: offset as usize,
                size,
            });
        }

        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Every metadata key and value, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// `general.architecture` ("llama", "lfm2", ...).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    fn missing(&self, key: &str) -> Error {
        Error::format(&self.path, format!("metadata key '{key}' is missing"))
    }

    fn wrong(&self, key: &str, v: &Value, expected: &str) -> Error {
        Error::format(
            &self.path,
            format!(
                "metadata key '{key}' is {}, expected {expected}",
                v.describe()
            ),
        )
    }

    fn required<T>(&self, key: &str, opt: Result<Option<T>>) -> Result<T> {
        opt?.ok_or_else(|| self.missing(key))
    }

    fn int_opt<T: TryFrom<i128>>(&self, key: &str, expected: &str) -> Result<Option<T>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let i = v.as_i128().ok_or_else(|| self.wrong(key, v, expected))?;
        T::try_from(i).map(Some).map_err(|_| {
            Error::format(
                &self.path,
                format!("metadata key '{key}' is {i}, which does not fit {expected}"),
            )
        })
    }

    /// Any integer value that fits a u32.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>> {
        self.int_opt(key, "u32")
    }
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.required(key, self.get_u32_opt(key))
    }
    pub fn get_i32_opt(&self, key: &str) -> Result<Option<i32>> {
        self.int_opt(key, "i32")
    }
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.required(key, self.get_i32_opt(key))
    }
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.int_opt(key, "u64")
    }
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.required(key, self.get_u64_opt(key))
    }
    pub fn get_usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.int_opt(key, "a non-negative integer")
    }
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.required(key, self.get_usize_opt(key))
    }

    /// An f32 or f64 value, as f32.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.wrong(key, v, "f32")),
        }
    }
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.required(key, self.get_f32_opt(key))
    }

    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, v, "bool")),
        }
    }
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.required(key, self.get_bool_opt(key))
    }

    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(key, v, "string")),
        }
    }
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.required(key, self.get_str_opt(key))
    }

    pub fn get_array_opt(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| self.wrong(key, v, "array")),
        }
    }
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.required(key, self.get_array_opt(key))
    }

    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<&[String]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::String(v))) => Ok(Some(v)),
            Some(v) => Err(self.wrong(key, v, "array of string")),
        }
    }
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        self.required(key, self.get_str_array_opt(key))
    }

    pub fn get_f32_array_opt(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::F32(v))) => Ok(Some(v)),
            Some(v) => Err(self.wrong(key, v, "array of f32")),
        }
    }
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        self.required(key, self.get_f32_array_opt(key))
    }

    pub fn get_i32_array_opt(&self, key: &str) -> Result<Option<&[i32]>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::I32(v))) => Ok(Some(v)),
            Some(v) => Err(self.wrong(key, v, "array of i32")),
        }
    }
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32]> {
        self.required(key, self.get_i32_array_opt(key))
    }

    /// An array of any integer type whose elements are all non-negative
    /// (per-layer head counts, for example).
    pub fn get_usize_array_opt(&self, key: &str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let ints = v
            .as_array()
            .and_then(Array::to_i128s)
            .ok_or_else(|| self.wrong(key, v, "array of integers"))?;
        ints.into_iter()
            .map(|i| usize::try_from(i).ok())
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| {
                Error::format(
                    &self.path,
                    format!("metadata key '{key}' holds a negative or oversized integer"),
                )
            })
    }
    pub fn get_usize_array(&self, key: &str) -> Result<Vec<usize>> {
        self.required(key, self.get_usize_array_opt(key))
    }
}

impl TensorSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| missing_tensor(&self.path, name))?;
        Ok(Tensor::mapped(
            info.name.clone(),
            info.dtype,
            info.shape.clone(),
            self.map.clone(),
            self.data_offset + info.offset,
            info.size,
        ))
    }

    fn has(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }

    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// Builds a GGUF v3 file: metadata in insertion order, then tensors in
/// insertion order, each aligned; [`GgufWriter::write`] publishes it
/// atomically.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` (replacing an earlier value in place, so copied metadata
    /// can be overridden). `general.alignment` must be a u32 power of two.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) -> Result<()> {
        let key = key.into();
        let value = value.into();
        if key == "general.alignment" && !matches!(value, Value::U32(a) if a.is_power_of_two()) {
            return Err(Error::invalid(format!(
                "general.alignment must be a u32 power of two, got {value:?}"
            )));
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key, value)),
        }
        Ok(())
    }

    /// Removes `key` if present.
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    /// Adds a tensor (its name must be new; its bytes are shared, not copied).
    pub fn add_tensor(&mut self, tensor: Tensor) -> Result<()> {
        if self.tensors.iter().any(|t| t.name == tensor.name) {
            return Err(Error::invalid(format!(
                "tensor '{}' added twice",
                tensor.name
            )));
        }
        if tensor.shape.is_empty() || tensor.shape.len() > MAX_DIMS || tensor.shape.contains(&0) {
            return Err(Error::invalid(format!(
                "tensor '{}': GGUF needs 1 to {MAX_DIMS} non-zero dimensions, got {:?}",
                tensor.name, tensor.shape
            )));
        }
        self.tensors.push(tensor);
        Ok(())
    }

    /// Adds a tensor from raw bytes, checked against the type and shape.
    pub fn add_tensor_bytes(
        &mut self,
        name: impl Into<String>,
        dtype: GgmlType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) -> Result<()> {
        self.add_tensor(Tensor::from_bytes(name, dtype, shape, bytes)?)
    }

    fn alignment(&self) -> usize {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => *a as usize,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Writes the file to `path` through a temporary file renamed into place;
    /// an existing file is replaced only when `overwrite` is set.
    pub fn write(&self, path: &Path, overwrite: bool) -> Result<()> {
        let mut f = AtomicFile::create(path, overwrite)?;
        self.write_to(f.writer()).map_err(|e| Error::io(path, e))?;
        f.commit()
    }

    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let align = self.alignment();
        let zeros = vec![0u8; align];
        let pad = |n: usize| &zeros[..n.next_multiple_of(align) - n];
        let mut head = Vec::new();
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            encode_str(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            encode_value(&mut head, v);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            encode_str(&mut head, &t.name);
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for &d in t.shape.iter().rev() {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            head.extend_from_slice(&t.dtype.id().to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + t.bytes().len()).next_multiple_of(align);
        }
        w.write_all(&head)?;
        w.write_all(pad(head.len()))?;
        for t in &self.tensors {
            w.write_all(t.bytes())?;
            w.write_all(pad(t.bytes().len()))?;
        }
        Ok(())
    }
}

pub(crate) fn encode_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

pub(crate) fn encode_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => encode_str(buf, s),
        Value::Array(a) => encode_array(buf, a),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn encode_array(buf: &mut Vec<u8>, a: &Array) {
    buf.extend_from_slice(&a.elem_type().id().to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => buf.extend_from_slice(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => buf.extend(v.iter().map(|&b| b as u8)),
        Array::String(v) => v.iter().for_each(|s| encode_str(buf, s)),
        Array::Array(v) => v.iter().for_each(|a| encode_array(buf, a)),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}
