//! ONNX model files: a hand-written, bounds-checked reader for the subset of
//! `onnx.proto` that inference needs (model, graph, nodes, attributes,
//! tensors, value infos with tensor shapes).
//!
//! Protobuf's wire format is small: every field is a varint key
//! `(number << 3) | wire_type` followed by a varint, a fixed 4 or 8 bytes, or a
//! varint length and that many bytes. Every length read from the file is
//! checked against the bytes that remain before anything is sliced or
//! allocated, so a truncated or hostile file is an [`Error::Format`] naming
//! the file, never a panic or a huge allocation. Unknown fields are skipped,
//! as protobuf requires.
//!
//! ```no_run
//! # fn main() -> lfm::Result<()> {
//! let model = lfm::formats::onnx::OnnxModel::open("model.onnx")?;
//! for node in &model.graph.nodes {
//!     if node.op_type == "Conv" {
//!         let group = node.int_or("group", 1)?;
//!         let weight = model.graph.constant(&node.inputs[1]).expect("weight");
//!         let w: Vec<f32> = weight.to_f32()?;
//!         # let _ = (group, w);
//!     }
//! }
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Nesting limit for graphs inside attributes (`If`, `Loop` bodies): deep
/// enough for any real model, shallow enough that a hostile file cannot
/// overflow the stack.
const MAX_DEPTH: usize = 32;

/// A parsed `ModelProto`.
#[derive(Debug, Clone)]
pub struct OnnxModel {
    pub path: PathBuf,
    pub ir_version: i64,
    pub opset_import: Vec<OpsetId>,
    pub producer_name: String,
    pub producer_version: String,
    pub domain: String,
    pub model_version: i64,
    pub doc_string: String,
    /// `metadata_props`, in file order.
    pub metadata: Vec<(String, String)>,
    pub graph: OnnxGraph,
}

/// One `opset_import` entry; the empty domain is the default `ai.onnx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsetId {
    pub domain: String,
    pub version: i64,
}

/// A parsed `GraphProto`, with an index of every constant tensor by name.
#[derive(Debug, Clone, Default)]
pub struct OnnxGraph {
    pub name: String,
    pub nodes: Vec<OnnxNode>,
    pub initializers: Vec<OnnxTensor>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub value_info: Vec<ValueInfo>,
    /// Name -> tensor for initializers and the outputs of `Constant` nodes.
    constants: HashMap<String, ConstantRef>,
}

#[derive(Debug, Clone, Copy)]
enum ConstantRef {
    Initializer(usize),
    /// A `Constant` node's `value` attribute.
    Node(usize),
}

/// A parsed `NodeProto`.
#[derive(Debug, Clone)]
pub struct OnnxNode {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    /// Input value names; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<OnnxAttribute>,
    file: Arc<Path>,
}

/// A parsed `AttributeProto`.
#[derive(Debug, Clone)]
pub struct OnnxAttribute {
    pub name: String,
    pub value: AttrValue,
}

/// An attribute's value, by its declared type (or, in files that predate
/// the `type` field, by the field that is present).
#[derive(Debug, Clone)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(OnnxTensor),
    Graph(OnnxGraph),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<OnnxTensor>),
    Graphs(Vec<OnnxGraph>),
    /// Sparse tensors and type protos: kept only as their type number.
    Unsupported(i32),
}

impl AttrValue {
    fn kind(&self) -> &'static str {
        match self {
            AttrValue::Float(_) => "FLOAT",
            AttrValue::Int(_) => "INT",
            AttrValue::String(_) => "STRING",
            AttrValue::Tensor(_) => "TENSOR",
            AttrValue::Graph(_) => "GRAPH",
            AttrValue::Floats(_) => "FLOATS",
            AttrValue::Ints(_) => "INTS",
            AttrValue::Strings(_) => "STRINGS",
            AttrValue::Tensors(_) => "TENSORS",
            AttrValue::Graphs(_) => "GRAPHS",
            AttrValue::Unsupported(_) => "an unsupported type",
        }
    }
}

/// `TensorProto.DataType`; the default, 0, is UNDEFINED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataType(pub i32);

impl DataType {
    pub const FLOAT: DataType = DataType(1);
    pub const UINT8: DataType = DataType(2);
    pub const INT8: DataType = DataType(3);
    pub const UINT16: DataType = DataType(4);
    pub const INT16: DataType = DataType(5);
    pub const INT32: DataType = DataType(6);
    pub const INT64: DataType = DataType(7);
    pub const STRING: DataType = DataType(8);
    pub const BOOL: DataType = DataType(9);
    pub const FLOAT16: DataType = DataType(10);
    pub const DOUBLE: DataType = DataType(11);
    pub const UINT32: DataType = DataType(12);
    pub const UINT64: DataType = DataType(13);
    pub const BFLOAT16: DataType = DataType(16);

    /// Integer and bool types (what [`OnnxTensor::to_i64`] reads).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::UINT8
                | DataType::INT8
                | DataType::UINT16
                | DataType::INT16
                | DataType::INT32
                | DataType::INT64
                | DataType::BOOL
                | DataType::UINT32
                | DataType::UINT64
        )
    }

    /// Bytes per element in `raw_data`, for the types this reader converts.
    fn raw_size(self) -> Option<usize> {
        Some(match self {
            DataType::UINT8 | DataType::INT8 | DataType::BOOL => 1,
            DataType::UINT16 | DataType::INT16 | DataType::FLOAT16 | DataType::BFLOAT16 => 2,
            DataType::FLOAT | DataType::INT32 | DataType::UINT32 => 4,
            DataType::INT64 | DataType::UINT64 | DataType::DOUBLE => 8,
            _ => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            DataType::FLOAT => "float32",
            DataType::UINT8 => "uint8",
            DataType::INT8 => "int8",
            DataType::UINT16 => "uint16",
            DataType::INT16 => "int16",
            DataType::INT32 => "int32",
            DataType::INT64 => "int64",
            DataType::STRING => "string",
            DataType::BOOL => "bool",
            DataType::FLOAT16 => "float16",
            DataType::DOUBLE => "float64",
            DataType::UINT32 => "uint32",
            DataType::UINT64 => "uint64",
            DataType::BFLOAT16 => "bfloat16",
            DataType(other) => return write!(f, "data type {other}"),
        };
        f.write_str(name)
    }
}

/// A parsed `TensorProto`. The data stays as stored (raw bytes or one of the
/// typed repeated fields) until [`OnnxTensor::to_f32`] or
/// [`OnnxTensor::to_i64`] converts and checks it.
#[derive(Debug, Clone)]
pub struct OnnxTensor {
    pub name: String,
    pub dims: Vec<i64>,
    pub data_type: DataType,
    data: TensorData,
    /// `data_location == EXTERNAL` or `external_data` entries present.
    external: bool,
    file: Arc<Path>,
}

#[derive(Debug, Clone)]
enum TensorData {
    Raw(Vec<u8>),
    Float(Vec<f32>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    Uint64(Vec<u64>),
    Strings(Vec<Vec<u8>>),
}

/// A graph input, output or intermediate value with its declared type.
#[derive(Debug, Clone, Default)]
pub struct ValueInfo {
    pub name: String,
    /// `Some` for tensor types; `None` for sequences, maps and the like.
    pub tensor: Option<TensorType>,
}

#[derive(Debug, Clone, Default)]
pub struct TensorType {
    pub elem_type: DataType,
    /// `None` when the shape is unknown (not even the rank).
    pub shape: Option<Vec<Dim>>,
}

/// One dimension of a declared shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Value(i64),
    Param(String),
    Unknown,
}

impl OnnxModel {
    /// Reads and parses `path`. A file that is not a protobuf `ModelProto`
    /// with a graph is reported as "not an ONNX model".
    pub fn open(path: impl AsRef<Path>) -> Result<OnnxModel> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        OnnxModel::parse(path, &bytes)
    }

    /// Parses the bytes of a model file; `path` is used in error messages.
    pub fn parse(path: impl AsRef<Path>, bytes: &[u8]) -> Result<OnnxModel> {
        let path = path.as_ref();
        let file: Arc<Path> = Arc::from(path);
        let not_onnx = |what: String| Error::format(path, format!("not an ONNX model ({what})"));
        let damaged = |e: ParseError| Error::format(path, format!("damaged ONNX file: {}", e.what));
        if bytes.is_empty() {
            return Err(not_onnx("the file is empty".into()));
        }
        let mut model = OnnxModel {
            path: path.to_path_buf(),
            ir_version: 0,
            opset_import: Vec::new(),
            producer_name: String::new(),
            producer_version: String::new(),
            domain: String::new(),
            model_version: 0,
            doc_string: String::new(),
            metadata: Vec::new(),
            graph: OnnxGraph::default(),
        };
        let mut has_ir_version = false;
        let mut has_graph = false;
        let mut r = Reader::new(bytes, &file, "ModelProto");
        let mut first = true;
        loop {
            let field = match r.next_field() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) if first => return Err(not_onnx(e.what)),
                Err(e) => return Err(damaged(e)),
            };
            // An image or a text file fails here: its first bytes do not
            // read as a ModelProto field.
            if first && !is_model_field(&field) {
                return Err(not_onnx(format!(
                    "the first bytes are not a ModelProto field: {:02x?}",
                    &bytes[..bytes.len().min(8)]
                )));
            }
            first = false;
            let res = (|| -> Parse<()> {
                match field.number {
                    1 => {
                        model.ir_version = field.int64()?;
                        has_ir_version = true;
                    }
                    2 => model.producer_name = field.string()?,
                    3 => model.producer_version = field.string()?,
                    4 => model.domain = field.string()?,
                    5 => model.model_version = field.int64()?,
                    6 => model.doc_string = field.string()?,
                    7 => {
                        model.graph = parse_graph(field.message("GraphProto")?, 0)?;
                        has_graph = true;
                    }
                    8 => model
                        .opset_import
                        .push(parse_opset(field.message("OperatorSetIdProto")?)?),
                    14 => model
                        .metadata
                        .push(parse_string_pair(field.message("StringStringEntryProto")?)?),
                    _ => {}
                }
                Ok(())
            })();
            res.map_err(damaged)?;
        }
        if !has_graph {
            return Err(not_onnx("no graph in the file".into()));
        }
        if !has_ir_version {
            return Err(not_onnx("no ir_version".into()));
        }
        Ok(model)
    }

    /// The opset version imported for `domain` ("" or "ai.onnx" for the
    /// default operator set).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let is_default = |d: &str| d.is_empty() || d == "ai.onnx";
        self.opset_import
            .iter()
            .find(|o| o.domain == domain || (is_default(domain) && is_default(&o.domain)))
            .map(|o| o.version)
    }

    /// The value of a `metadata_props` entry.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl OnnxGraph {
    /// An initializer by name.
    pub fn initializer(&self, name: &str) -> Option<&OnnxTensor> {
        match self.constants.get(name)? {
            ConstantRef::Initializer(i) => Some(&self.initializers[*i]),
            ConstantRef::Node(_) => None,
        }
    }

    /// A constant by value name: an initializer, or the `value` tensor of
    /// the `Constant` node that outputs it.
    pub fn constant(&self, name: &str) -> Option<&OnnxTensor> {
        match self.constants.get(name)? {
            ConstantRef::Initializer(i) => Some(&self.initializers[*i]),
            ConstantRef::Node(n) => match &self.nodes[*n].attr("value")?.value {
                AttrValue::Tensor(t) => Some(t),
                _ => None,
            },
        }
    }

    /// The node that outputs value `name`.
    pub fn producer(&self, name: &str) -> Option<&OnnxNode> {
        self.nodes
            .iter()
            .find(|n| n.outputs.iter().any(|o| o == name))
    }

    /// A graph input by name.
    pub fn input(&self, name: &str) -> Option<&ValueInfo> {
        self.inputs.iter().find(|v| v.name == name)
    }

    fn index_constants(&mut self) {
        for (i, t) in self.initializers.iter().enumerate() {
            self.constants
                .insert(t.name.clone(), ConstantRef::Initializer(i));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let is_tensor_constant = n.op_type == "Constant"
                && (n.domain.is_empty() || n.domain == "ai.onnx")
                && matches!(
                    n.attr("value").map(|a| &a.value),
                    Some(AttrValue::Tensor(_))
                );
            if is_tensor_constant {
                if let Some(out) = n.outputs.first() {
                    self.constants.insert(out.clone(), ConstantRef::Node(i));
                }
            }
        }
    }
}

impl OnnxNode {
    /// An attribute by name.
    pub fn attr(&self, name: &str) -> Option<&OnnxAttribute> {
        self.attributes.iter().find(|a| a.name == name)
    }

    /// "node 'conv_1' (Conv)", for messages.
    pub fn describe(&self) -> String {
        if self.name.is_empty() {
            let out = self.outputs.first().map(String::as_str).unwrap_or("");
            format!("{} node with output '{out}'", self.op_type)
        } else {
            format!("node '{}' ({})", self.name, self.op_type)
        }
    }

    /// An error about this node, naming the file.
    pub fn error(&self, what: impl fmt::Display) -> Error {
        Error::format(&self.file, format!("{}: {what}", self.describe()))
    }

    /// An "unsupported" error about this node, naming the file.
    pub fn unsupported(&self, what: impl fmt::Display) -> Error {
        Error::unsupported(&self.file, format!("{}: {what}", self.describe()))
    }

    fn required(&self, name: &str) -> Result<&AttrValue> {
        self.attr(name)
            .map(|a| &a.value)
            .ok_or_else(|| self.error(format_args!("attribute '{name}' is missing")))
    }

    fn wrong_type(&self, name: &str, want: &str, got: &AttrValue) -> Error {
        self.error(format_args!(
            "attribute '{name}' is {}, expected {want}",
            got.kind()
        ))
    }

    /// A required INT attribute.
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.required(name)? {
            AttrValue::Int(v) => Ok(*v),
            other => Err(self.wrong_type(name, "INT", other)),
        }
    }

    /// An optional INT attribute with its default.
    pub fn int_or(&self, name: &str, default: i64) -> Result<i64> {
        match self.attr(name) {
            None => Ok(default),
            Some(_) => self.int(name),
        }
    }

    /// A required FLOAT attribute.
    pub fn float(&self, name: &str) -> Result<f32> {
        match self.required(name)? {
            AttrValue::Float(v) => Ok(*v),
            other => Err(self.wrong_type(name, "FLOAT", other)),
        }
    }

    /// An optional FLOAT attribute with its default.
    pub fn float_or(&self, name: &str, default: f32) -> Result<f32> {
        match self.attr(name) {
            None => Ok(default),
            Some(_) => self.float(name),
        }
    }

    /// A required STRING attribute, as UTF-8 text.
    pub fn string(&self, name: &str) -> Result<&str> {
        match self.required(name)? {
            AttrValue::String(v) => std::str::from_utf8(v)
                .map_err(|_| self.error(format_args!("attribute '{name}' is not UTF-8"))),
            other => Err(self.wrong_type(name, "STRING", other)),
        }
    }

    /// An optional STRING attribute with its default.
    pub fn string_or<'a>(&'a self, name: &str, default: &'a str) -> Result<&'a str> {
        match self.attr(name) {
            None => Ok(default),
            Some(_) => self.string(name),
        }
    }

    /// A required INTS attribute.
    pub fn ints(&self, name: &str) -> Result<&[i64]> {
        match self.required(name)? {
            AttrValue::Ints(v) => Ok(v),
            other => Err(self.wrong_type(name, "INTS", other)),
        }
    }

    /// An optional INTS attribute with its default.
    pub fn ints_or(&self, name: &str, default: &[i64]) -> Result<Vec<i64>> {
        match self.attr(name) {
            None => Ok(default.to_vec()),
            Some(_) => self.ints(name).map(<[i64]>::to_vec),
        }
    }

    /// A required FLOATS attribute.
    pub fn floats(&self, name: &str) -> Result<&[f32]> {
        match self.required(name)? {
            AttrValue::Floats(v) => Ok(v),
            other => Err(self.wrong_type(name, "FLOATS", other)),
        }
    }

    /// A required STRINGS attribute, as UTF-8 text.
    pub fn strings(&self, name: &str) -> Result<Vec<&str>> {
        match self.required(name)? {
            AttrValue::Strings(v) => v
                .iter()
                .map(|s| {
                    std::str::from_utf8(s)
                        .map_err(|_| self.error(format_args!("attribute '{name}' is not UTF-8")))
                })
                .collect(),
            other => Err(self.wrong_type(name, "STRINGS", other)),
        }
    }

    /// A required TENSOR attribute.
    pub fn tensor(&self, name: &str) -> Result<&OnnxTensor> {
        match self.required(name)? {
            AttrValue::Tensor(t) => Ok(t),
            other => Err(self.wrong_type(name, "TENSOR", other)),
        }
    }

    /// A required GRAPH attribute (the body of `If`, `Loop`, `Scan`).
    pub fn graph(&self, name: &str) -> Result<&OnnxGraph> {
        match self.required(name)? {
            AttrValue::Graph(g) => Ok(g),
            other => Err(self.wrong_type(name, "GRAPH", other)),
        }
    }
}

impl OnnxTensor {
    /// The dimensions as sizes; a negative dimension is an error.
    pub fn shape(&self) -> Result<Vec<usize>> {
        self.dims
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    self.error(format_args!("negative dimension {d} in {:?}", self.dims))
                })
            })
            .collect()
    }

    /// The number of elements (1 for a scalar), with overflow checked.
    pub fn numel(&self) -> Result<usize> {
        self.shape()?.iter().try_fold(1usize, |acc, &d| {
            acc.checked_mul(d)
                .ok_or_else(|| self.error(format_args!("shape {:?} overflows", self.dims)))
        })
    }

    /// Whether the data lives in a separate file (not supported).
    pub fn is_external(&self) -> bool {
        self.external
    }

    fn error(&self, what: impl fmt::Display) -> Error {
        Error::format(&self.file, format!("tensor '{}': {what}", self.name))
    }

    fn unsupported(&self, what: impl fmt::Display) -> Error {
        Error::unsupported(&self.file, format!("tensor '{}': {what}", self.name))
    }

    /// Checks that the stored data holds exactly `numel` elements.
    fn check_len(&self, have: usize) -> Result<usize> {
        if self.external {
            return Err(self.unsupported("data is stored in an external file"));
        }
        let n = self.numel()?;
        if have != n {
            return Err(self.error(format_args!(
                "shape {:?} needs {n} {} values but the file holds {have}",
                self.dims, self.data_type
            )));
        }
        Ok(n)
    }

    fn raw_elements<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        raw.chunks_exact(N)
            .map(|c| c.try_into().expect("chunks_exact yields N bytes"))
    }

    /// The values as f32, converted from any float or integer type. The
    /// element count is checked against the shape.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let dt = self.data_type;
        match &self.data {
            TensorData::Raw(raw) => {
                let size = dt
                    .raw_size()
                    .ok_or_else(|| self.unsupported(format_args!("{dt} values")))?;
                if raw.len() % size != 0 {
                    return Err(self.error(format_args!(
                        "raw_data of {} bytes is not a whole number of {dt} values",
                        raw.len()
                    )));
                }
                self.check_len(raw.len() / size)?;
                Ok(match dt {
                    DataType::FLOAT => Self::raw_elements::<4>(raw)
                        .map(f32::from_le_bytes)
                        .collect(),
                    DataType::FLOAT16 => Self::raw_elements::<2>(raw)
                        .map(|b| half::f16::from_le_bytes(b).to_f32())
                        .collect(),
                    DataType::BFLOAT16 => Self::raw_elements::<2>(raw)
                        .map(|b| half::bf16::from_le_bytes(b).to_f32())
                        .collect(),
                    DataType::DOUBLE => Self::raw_elements::<8>(raw)
                        .map(|b| f64::from_le_bytes(b) as f32)
                        .collect(),
                    _ => self.to_i64()?.into_iter().map(|v| v as f32).collect(),
                })
            }
            TensorData::Float(v) if dt == DataType::FLOAT => {
                self.check_len(v.len())?;
                Ok(v.clone())
            }
            TensorData::Double(v) if dt == DataType::DOUBLE => {
                self.check_len(v.len())?;
                Ok(v.iter().map(|&x| x as f32).collect())
            }
            // float16 and bfloat16 are stored as their bit patterns in int32_data.
            TensorData::Int32(v) if dt == DataType::FLOAT16 || dt == DataType::BFLOAT16 => {
                self.check_len(v.len())?;
                Ok(v.iter()
                    .map(|&bits| {
                        if dt == DataType::FLOAT16 {
                            half::f16::from_bits(bits as u16).to_f32()
                        } else {
                            half::bf16::from_bits(bits as u16).to_f32()
                        }
                    })
                    .collect())
            }
            _ if dt.is_integer() => Ok(self.to_i64()?.into_iter().map(|v| v as f32).collect()),
            _ => Err(self.wrong_field()),
        }
    }

    fn wrong_field(&self) -> Error {
        self.error(format_args!(
            "{} tensor stores its values in the wrong field",
            self.data_type
        ))
    }

    /// The values as i64, from any integer or bool type. The element count
    /// is checked against the shape.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let dt = self.data_type;
        if !dt.is_integer() {
            return Err(self.error(format_args!("holds {dt} values, expected integers")));
        }
        match &self.data {
            TensorData::Raw(raw) => {
                let size = dt.raw_size().expect("integer types have a raw size");
                if raw.len() % size != 0 {
                    return Err(self.error(format_args!(
                        "raw_data of {} bytes is not a whole number of {dt} values",
                        raw.len()
                    )));
                }
                self.check_len(raw.len() / size)?;
                Ok(match dt {
                    DataType::UINT8 | DataType::BOOL => raw.iter().map(|&b| b as i64).collect(),
                    DataType::INT8 => raw.iter().map(|&b| b as i8 as i64).collect(),
                    DataType::UINT16 => Self::raw_elements::<2>(raw)
                        .map(|b| u16::from_le_bytes(b) as i64)
                        .collect(),
                    DataType::INT16 => Self::raw_elements::<2>(raw)
                        .map(|b| i16::from_le_bytes(b) as i64)
                        .collect(),
                    DataType::INT32 => Self::raw_elements::<4>(raw)
                        .map(|b| i32::from_le_bytes(b) as i64)
                        .collect(),
                    DataType::UINT32 => Self::raw_elements::<4>(raw)
                        .map(|b| u32::from_le_bytes(b) as i64)
                        .collect(),
                    // uint64 above i64::MAX wraps: no model needs such values
                    // as indices or shapes.
                    _ => Self::raw_elements::<8>(raw)
                        .map(i64::from_le_bytes)
                        .collect(),
                })
            }
            TensorData::Int32(v) => {
                self.check_len(v.len())?;
                Ok(v.iter().map(|&x| x as i64).collect())
            }
            TensorData::Int64(v) => {
                self.check_len(v.len())?;
                Ok(v.clone())
            }
            TensorData::Uint64(v) => {
                self.check_len(v.len())?;
                Ok(v.iter().map(|&x| x as i64).collect())
            }
            _ => Err(self.wrong_field()),
        }
    }

    /// The values of a STRING tensor.
    pub fn strings(&self) -> Result<&[Vec<u8>]> {
        match &self.data {
            TensorData::Strings(v) if self.data_type == DataType::STRING => {
                self.check_len(v.len())?;
                Ok(v)
            }
            _ => Err(self.error(format_args!(
                "holds {} values, expected strings",
                self.data_type
            ))),
        }
    }
}

// ---------------------------------------------------------------------------
// The protobuf wire format.

/// A parse failure before the file name is attached.
#[derive(Debug)]
struct ParseError {
    what: String,
}

type Parse<T> = std::result::Result<T, ParseError>;

/// Reads fields from one message's bytes; `offset` is the message's start
/// in the file, for messages.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    offset: usize,
    message: &'static str,
    file: &'a Arc<Path>,
}

/// One field: its number and its payload.
struct Field<'a> {
    number: u64,
    payload: Payload<'a>,
    /// Where the field starts in the file and which message holds it.
    at: usize,
    message: &'static str,
    file: &'a Arc<Path>,
}

enum Payload<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Fixed32([u8; 4]),
    /// Length-delimited bytes, with their offset in the file.
    Bytes(&'a [u8], usize),
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], file: &'a Arc<Path>, message: &'static str) -> Self {
        Reader {
            buf,
            pos: 0,
            offset: 0,
            message,
            file,
        }
    }

    fn fail(&self, at: usize, what: impl fmt::Display) -> ParseError {
        ParseError {
            what: format!("{} at byte {}: {what}", self.message, self.offset + at),
        }
    }

    fn varint(&mut self) -> Parse<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.fail(start, "truncated varint"));
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.fail(start, "varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize, what: &str) -> Parse<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(self.fail(
                self.pos,
                format_args!("truncated: {what} needs {n} bytes, {left} left"),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The next field, or `None` at the end of the message.
    fn next_field(&mut self) -> Parse<Option<Field<'a>>> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let at = self.pos;
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 {
            return Err(self.fail(at, "field number 0"));
        }
        let payload = match key & 7 {
            0 => Payload::Varint(self.varint()?),
            1 => Payload::Fixed64(
                self.take(8, "a 64-bit field")?
                    .try_into()
                    .expect("took 8 bytes"),
            ),
            2 => {
                let len = self.varint()?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                let start = self.offset + self.pos;
                Payload::Bytes(self.take(len, &format!("field {number}"))?, start)
            }
            5 => Payload::Fixed32(
                self.take(4, "a 32-bit field")?
                    .try_into()
                    .expect("took 4 bytes"),
            ),
            w => {
                return Err(self.fail(
                    at,
                    format_args!("field {number} has wire type {w}, which ONNX does not use"),
                ))
            }
        };
        Ok(Some(Field {
            number,
            payload,
            at: self.offset + at,
            message: self.message,
            file: self.file,
        }))
    }
}

impl<'a> Field<'a> {
    fn fail(&self, what: impl fmt::Display) -> ParseError {
        ParseError {
            what: format!(
                "{} field {} at byte {}: {what}",
                self.message, self.number, self.at
            ),
        }
    }

    fn wire_name(&self) -> &'static str {
        match self.payload {
            Payload::Varint(_) => "a varint",
            Payload::Fixed64(_) => "a 64-bit value",
            Payload::Fixed32(_) => "a 32-bit value",
            Payload::Bytes(..) => "bytes",
        }
    }

    fn varint(&self) -> Parse<u64> {
        match self.payload {
            Payload::Varint(v) => Ok(v),
            _ => Err(self.fail(format_args!(
                "expected a varint, found {}",
                self.wire_name()
            ))),
        }
    }

    /// int64 and int32 fields hold the two's complement in a varint.
    fn int64(&self) -> Parse<i64> {
        Ok(self.varint()? as i64)
    }

    fn int32(&self) -> Parse<i32> {
        Ok(self.varint()? as i64 as i32)
    }

    fn float(&self) -> Parse<f32> {
        match self.payload {
            Payload::Fixed32(b) => Ok(f32::from_le_bytes(b)),
            _ => Err(self.fail(format_args!("expected a float, found {}", self.wire_name()))),
        }
    }

    fn bytes(&self) -> Parse<&'a [u8]> {
        match self.payload {
            Payload::Bytes(b, _) => Ok(b),
            _ => Err(self.fail(format_args!("expected bytes, found {}", self.wire_name()))),
        }
    }

    fn string(&self) -> Parse<String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| self.fail("text is not UTF-8"))
    }

    fn message(&self, name: &'static str) -> Parse<Reader<'a>> {
        match self.payload {
            Payload::Bytes(b, start) => Ok(Reader {
                buf: b,
                pos: 0,
                offset: start,
                message: name,
                file: self.file,
            }),
            _ => Err(self.fail(format_args!(
                "expected a {name} message, found {}",
                self.wire_name()
            ))),
        }
    }

    /// Appends a repeated varint field, packed or not.
    fn push_varints(&self, out: &mut Vec<u64>) -> Parse<()> {
        match self.payload {
            Payload::Varint(v) => out.push(v),
            Payload::Bytes(b, start) => {
                let mut r = Reader {
                    buf: b,
                    pos: 0,
                    offset: start,
                    message: self.message,
                    file: self.file,
                };
                while r.pos < b.len() {
                    out.push(r.varint()?);
                }
            }
            _ => {
                return Err(self.fail(format_args!("expected varints, found {}", self.wire_name())))
            }
        }
        Ok(())
    }

    /// Appends a repeated fixed-size field (float, double), packed or not.
    fn push_fixed<const N: usize, T>(
        &self,
        out: &mut Vec<T>,
        convert: fn([u8; N]) -> T,
    ) -> Parse<()> {
        let one: Option<&[u8]> = match &self.payload {
            Payload::Fixed32(b) if N == 4 => Some(b),
            Payload::Fixed64(b) if N == 8 => Some(b),
            Payload::Bytes(..) => None,
            _ => {
                return Err(self.fail(format_args!(
                    "expected {N}-byte values, found {}",
                    self.wire_name()
                )))
            }
        };
        if let Some(b) = one {
            out.push(convert(b.try_into().expect("N bytes")));
            return Ok(());
        }
        let b = self.bytes()?;
        if b.len() % N != 0 {
            return Err(self.fail(format_args!(
                "packed field of {} bytes is not a multiple of {N}",
                b.len()
            )));
        }
        out.extend(
            b.chunks_exact(N)
                .map(|c| convert(c.try_into().expect("chunks_exact yields N bytes"))),
        );
        Ok(())
    }
}

/// Whether `f` has the number and wire type of a `ModelProto` field.
fn is_model_field(f: &Field<'_>) -> bool {
    match f.number {
        1 | 5 => matches!(f.payload, Payload::Varint(_)),
        2..=4 | 6..=8 | 14 | 20 | 25 => matches!(f.payload, Payload::Bytes(..)),
        _ => false,
    }
}

fn parse_opset(mut r: Reader<'_>) -> Parse<OpsetId> {
    let mut o = OpsetId {
        domain: String::new(),
        version: 0,
    };
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => o.domain = f.string()?,
            2 => o.version = f.int64()?,
            _ => {}
        }
    }
    Ok(o)
}

fn parse_string_pair(mut r: Reader<'_>) -> Parse<(String, String)> {
    let (mut key, mut value) = (String::new(), String::new());
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => key = f.string()?,
            2 => value = f.string()?,
            _ => {}
        }
    }
    Ok((key, value))
}

fn parse_graph(mut r: Reader<'_>, depth: usize) -> Parse<OnnxGraph> {
    if depth > MAX_DEPTH {
        return Err(r.fail(0, format_args!("graphs nested deeper than {MAX_DEPTH}")));
    }
    let mut g = OnnxGraph::default();
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => g.nodes.push(parse_node(f.message("NodeProto")?, depth)?),
            2 => g.name = f.string()?,
            5 => g
                .initializers
                .push(parse_tensor(f.message("TensorProto")?)?),
            11 => g
                .inputs
                .push(parse_value_info(f.message("ValueInfoProto")?)?),
            12 => g
                .outputs
                .push(parse_value_info(f.message("ValueInfoProto")?)?),
            13 => g
                .value_info
                .push(parse_value_info(f.message("ValueInfoProto")?)?),
            _ => {}
        }
    }
    g.index_constants();
    Ok(g)
}

fn parse_node(mut r: Reader<'_>, depth: usize) -> Parse<OnnxNode> {
    let mut n = OnnxNode {
        name: String::new(),
        op_type: String::new(),
        domain: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        attributes: Vec::new(),
        file: r.file.clone(),
    };
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => n.inputs.push(f.string()?),
            2 => n.outputs.push(f.string()?),
            3 => n.name = f.string()?,
            4 => n.op_type = f.string()?,
            5 => n
                .attributes
                .push(parse_attribute(f.message("AttributeProto")?, depth)?),
            7 => n.domain = f.string()?,
            _ => {}
        }
    }
    Ok(n)
}

fn parse_attribute(mut r: Reader<'_>, depth: usize) -> Parse<OnnxAttribute> {
    let mut name = String::new();
    let mut declared: i32 = 0;
    // Every field as read; the declared type (or the one present) picks one.
    let mut f32_value = None;
    let mut i64_value = None;
    let mut s_value = None;
    let mut t_value = None;
    let mut g_value = None;
    let mut floats = Vec::new();
    let mut ints = Vec::new();
    let mut strings = Vec::new();
    let mut tensors = Vec::new();
    let mut graphs = Vec::new();
    let mut has_list = None;
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => name = f.string()?,
            20 => declared = f.int32()?,
            2 => f32_value = Some(f.float()?),
            3 => i64_value = Some(f.int64()?),
            4 => s_value = Some(f.bytes()?.to_vec()),
            5 => t_value = Some(parse_tensor(f.message("TensorProto")?)?),
            6 => g_value = Some(parse_graph(f.message("GraphProto")?, depth + 1)?),
            7 => {
                f.push_fixed::<4, f32>(&mut floats, f32::from_le_bytes)?;
                has_list = Some(6);
            }
            8 => {
                let mut v = Vec::new();
                f.push_varints(&mut v)?;
                ints.extend(v.into_iter().map(|x| x as i64));
                has_list = Some(7);
            }
            9 => {
                strings.push(f.bytes()?.to_vec());
                has_list = Some(8);
            }
            10 => {
                tensors.push(parse_tensor(f.message("TensorProto")?)?);
                has_list = Some(9);
            }
            11 => {
                graphs.push(parse_graph(f.message("GraphProto")?, depth + 1)?);
                has_list = Some(10);
            }
            _ => {}
        }
    }
    let kind = if declared != 0 {
        declared
    } else if f32_value.is_some() {
        1
    } else if i64_value.is_some() {
        2
    } else if s_value.is_some() {
        3
    } else if t_value.is_some() {
        4
    } else if g_value.is_some() {
        5
    } else {
        has_list.unwrap_or(0)
    };
    let missing = |what: &str| {
        r.fail(
            0,
            format_args!("attribute '{name}' is declared {what} but has no value"),
        )
    };
    let value = match kind {
        1 => AttrValue::Float(f32_value.ok_or_else(|| missing("FLOAT"))?),
        2 => AttrValue::Int(i64_value.ok_or_else(|| missing("INT"))?),
        3 => AttrValue::String(s_value.unwrap_or_default()),
        4 => AttrValue::Tensor(t_value.ok_or_else(|| missing("TENSOR"))?),
        5 => AttrValue::Graph(g_value.ok_or_else(|| missing("GRAPH"))?),
        6 => AttrValue::Floats(floats),
        7 => AttrValue::Ints(ints),
        8 => AttrValue::Strings(strings),
        9 => AttrValue::Tensors(tensors),
        10 => AttrValue::Graphs(graphs),
        other => AttrValue::Unsupported(other),
    };
    Ok(OnnxAttribute { name, value })
}

fn parse_tensor(mut r: Reader<'_>) -> Parse<OnnxTensor> {
    let mut t = OnnxTensor {
        name: String::new(),
        dims: Vec::new(),
        data_type: DataType(0),
        data: TensorData::Raw(Vec::new()),
        external: false,
        file: r.file.clone(),
    };
    // Typed fields accumulate; the last kind seen wins (a valid file has one).
    let mut floats: Vec<f32> = Vec::new();
    let mut int32s: Vec<u64> = Vec::new();
    let mut int64s: Vec<u64> = Vec::new();
    let mut doubles: Vec<f64> = Vec::new();
    let mut uint64s: Vec<u64> = Vec::new();
    let mut strings: Vec<Vec<u8>> = Vec::new();
    let mut raw: Option<Vec<u8>> = None;
    let mut dims = Vec::new();
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => f.push_varints(&mut dims)?,
            2 => t.data_type = DataType(f.int32()?),
            4 => f.push_fixed::<4, f32>(&mut floats, f32::from_le_bytes)?,
            5 => f.push_varints(&mut int32s)?,
            6 => strings.push(f.bytes()?.to_vec()),
            7 => f.push_varints(&mut int64s)?,
            8 => t.name = f.string()?,
            9 => raw = Some(f.bytes()?.to_vec()),
            10 => f.push_fixed::<8, f64>(&mut doubles, f64::from_le_bytes)?,
            11 => f.push_varints(&mut uint64s)?,
            13 => {
                f.message("StringStringEntryProto")?;
                t.external = true;
            }
            14 => t.external |= f.int32()? == 1,
            _ => {}
        }
    }
    t.dims = dims.into_iter().map(|d| d as i64).collect();
    t.data = if let Some(raw) = raw {
        TensorData::Raw(raw)
    } else if !floats.is_empty() {
        TensorData::Float(floats)
    } else if !int32s.is_empty() {
        TensorData::Int32(int32s.into_iter().map(|v| v as i64 as i32).collect())
    } else if !int64s.is_empty() {
        TensorData::Int64(int64s.into_iter().map(|v| v as i64).collect())
    } else if !doubles.is_empty() {
        TensorData::Double(doubles)
    } else if !uint64s.is_empty() {
        TensorData::Uint64(uint64s)
    } else if !strings.is_empty() {
        TensorData::Strings(strings)
    } else {
        // No data at all: an empty tensor, or one whose shape promises
        // values it lacks (caught by the accessors' length check).
        match t.data_type {
            DataType::STRING => TensorData::Strings(Vec::new()),
            _ => TensorData::Raw(Vec::new()),
        }
    };
    Ok(t)
}

fn parse_value_info(mut r: Reader<'_>) -> Parse<ValueInfo> {
    let mut v = ValueInfo::default();
    while let Some(f) = r.next_field()? {
        match f.number {
            1 => v.name = f.string()?,
            2 => v.tensor = parse_type(f.message("TypeProto")?)?,
            _ => {}
        }
    }
    Ok(v)
}

/// A `TypeProto`: only its `tensor_type` is kept (sequences, maps and
/// optionals are skipped, which needs no recursion).
fn parse_type(mut r: Reader<'_>) -> Parse<Option<TensorType>> {
    let mut out = None;
    while let Some(f) = r.next_field()? {
        if f.number == 1 {
            let mut tt = TensorType::default();
            let mut tr = f.message("TypeProto.Tensor")?;
            while let Some(tf) = tr.next_field()? {
                match tf.number {
                    1 => tt.elem_type = DataType(tf.int32()?),
                    2 => tt.shape = Some(parse_shape(tf.message("TensorShapeProto")?)?),
                    _ => {}
                }
            }
            out = Some(tt);
        }
    }
    Ok(out)
}

fn parse_shape(mut r: Reader<'_>) -> Parse<Vec<Dim>> {
    let mut dims = Vec::new();
    while let Some(f) = r.next_field()? {
        if f.number == 1 {
            let mut d = Dim::Unknown;
            let mut dr = f.message("TensorShapeProto.Dimension")?;
            while let Some(df) = dr.next_field()? {
                match df.number {
                    1 => d = Dim::Value(df.int64()?),
                    2 => d = Dim::Param(df.string()?),
                    _ => {}
                }
            }
            dims.push(d);
        }
    }
    Ok(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal protobuf writer for building test files by hand.
    #[derive(Default)]
    struct Pb(Vec<u8>);

    impl Pb {
        fn varint(&mut self, mut v: u64) -> &mut Self {
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    self.0.push(b);
                    return self;
                }
                self.0.push(b | 0x80);
            }
        }
        fn key(&mut self, n: u64, wire: u64) -> &mut Self {
            self.varint(n << 3 | wire)
        }
        fn int(&mut self, n: u64, v: i64) -> &mut Self {
            self.key(n, 0).varint(v as u64)
        }
        fn bytes(&mut self, n: u64, b: &[u8]) -> &mut Self {
            self.key(n, 2).varint(b.len() as u64);
            self.0.extend_from_slice(b);
            self
        }
        fn float(&mut self, n: u64, v: f32) -> &mut Self {
            self.key(n, 5);
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn msg(&mut self, n: u64, m: &Pb) -> &mut Self {
            self.bytes(n, &m.0)
        }
        fn take(&mut self) -> Pb {
            std::mem::take(self)
        }
    }

    fn model_with(graph: &Pb) -> Vec<u8> {
        let mut opset = Pb::default();
        opset.bytes(1, b"").int(2, 13);
        let mut m = Pb::default();
        m.int(1, 8).bytes(2, b"test").msg(8, &opset).msg(7, graph);
        m.0
    }

    fn tensor_raw(name: &str, dims: &[i64], dt: i32, raw: &[u8]) -> Pb {
        let mut t = Pb::default();
        for &d in dims {
            t.int(1, d);
        }
        t.int(2, dt as i64).bytes(8, name.as_bytes()).bytes(9, raw);
        t
    }

    #[test]
    fn reads_a_hand_built_model() {
        let w: Vec<u8> = [1.0f32, -2.0, 0.5, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let init = tensor_raw("w", &[2, 2], 1, &w);
        // A Constant node with packed int64_data, and one with unpacked floats.
        let mut shape = Pb::default();
        shape.int(1, 3).int(2, 7).bytes(8, b"shape");
        let mut packed = Pb::default();
        for v in [1i64, -1, 4] {
            packed.varint(v as u64);
        }
        shape.bytes(7, &packed.0);
        let mut attr = Pb::default();
        attr.bytes(1, b"value").int(20, 4).msg(5, &shape);
        let mut cnode = Pb::default();
        cnode
            .bytes(2, b"shape_out")
            .bytes(4, b"Constant")
            .msg(5, &attr);
        let mut scalar = Pb::default();
        scalar.int(2, 1).float(4, 2.5).bytes(8, b"s");
        let mut attr2 = Pb::default();
        attr2.bytes(1, b"value").msg(5, &scalar);
        let mut cnode2 = Pb::default();
        cnode2
            .bytes(2, b"s_out")
            .bytes(4, b"Constant")
            .msg(5, &attr2);
        // A Conv with INTS (unpacked), INT, FLOAT, STRING attributes.
        let mut conv = Pb::default();
        conv.bytes(1, b"x").bytes(1, b"w").bytes(2, b"y");
        conv.bytes(3, b"conv0").bytes(4, b"Conv");
        let mut a = Pb::default();
        a.bytes(1, b"pads")
            .int(20, 7)
            .int(8, 1)
            .int(8, 1)
            .int(8, 0)
            .int(8, 0);
        conv.msg(5, &a.take());
        a.bytes(1, b"group").int(20, 2).int(3, 1);
        conv.msg(5, &a.take());
        a.bytes(1, b"alpha").int(20, 1).float(2, 0.25);
        conv.msg(5, &a.take());
        a.bytes(1, b"mode").int(20, 3).bytes(4, b"nearest");
        conv.msg(5, &a.take());
        // Graph input x: float [1, 3, "h", ?].
        let mut dim = Pb::default();
        let mut shape_p = Pb::default();
        dim.int(1, 1);
        shape_p.msg(1, &dim.take());
        dim.int(1, 3);
        shape_p.msg(1, &dim.take());
        dim.bytes(2, b"h");
        shape_p.msg(1, &dim.take());
        shape_p.msg(1, &Pb::default());
        let mut tt = Pb::default();
        tt.int(1, 1).msg(2, &shape_p);
        let mut ty = Pb::default();
        ty.msg(1, &tt);
        let mut vi = Pb::default();
        vi.bytes(1, b"x").msg(2, &ty);
        let mut g = Pb::default();
        g.msg(1, &cnode)
            .msg(1, &cnode2)
            .msg(1, &conv)
            .bytes(2, b"g");
        g.msg(5, &init).msg(11, &vi);
        // An unknown field (number 99, varint) must be skipped.
        g.int(99, 5);

        let m = OnnxModel::parse("t.onnx", &model_with(&g)).unwrap();
        assert_eq!(m.ir_version, 8);
        assert_eq!(m.producer_name, "test");
        assert_eq!(m.opset(""), Some(13));
        assert_eq!(m.opset("ai.onnx"), Some(13));
        let g = &m.graph;
        assert_eq!(g.name, "g");
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(
            g.initializer("w").unwrap().to_f32().unwrap(),
            [1.0, -2.0, 0.5, 4.0]
        );
        assert!(g.initializer("shape_out").is_none());
        assert_eq!(
            g.constant("shape_out").unwrap().to_i64().unwrap(),
            [1, -1, 4]
        );
        let s = g.constant("s_out").unwrap();
        assert!(s.dims.is_empty());
        assert_eq!(s.to_f32().unwrap(), [2.5]);
        let conv = &g.nodes[2];
        assert_eq!(conv.inputs, ["x", "w"]);
        assert_eq!(conv.ints("pads").unwrap(), [1, 1, 0, 0]);
        assert_eq!(conv.int("group").unwrap(), 1);
        assert_eq!(conv.int_or("missing", 7).unwrap(), 7);
        assert_eq!(conv.float("alpha").unwrap(), 0.25);
        assert_eq!(conv.string("mode").unwrap(), "nearest");
        let e = conv.int("alpha").unwrap_err().to_string();
        assert!(
            e.contains("t.onnx")
                && e.contains("conv0")
                && e.contains("alpha")
                && e.contains("FLOAT"),
            "{e}"
        );
        let e = conv.ints("strides").unwrap_err().to_string();
        assert!(e.contains("'strides' is missing"), "{e}");
        let x = &g.input("x").unwrap().tensor.as_ref().unwrap();
        assert_eq!(x.elem_type, DataType::FLOAT);
        assert_eq!(
            x.shape.as_ref().unwrap(),
            &[
                Dim::Value(1),
                Dim::Value(3),
                Dim::Param("h".into()),
                Dim::Unknown
            ]
        );
    }

    #[test]
    fn tensor_data_is_checked_against_the_shape() {
        let t = tensor_raw("short", &[3], 1, &[0; 8]);
        let mut g = Pb::default();
        g.msg(5, &t);
        let m = OnnxModel::parse("t.onnx", &model_with(&g)).unwrap();
        let e = m.graph.initializer("short").unwrap().to_f32().unwrap_err();
        assert!(
            e.to_string()
                .contains("needs 3 float32 values but the file holds 2"),
            "{e}"
        );

        // A shape whose element count overflows must not be allocated.
        let t = tensor_raw("huge", &[1 << 40, 1 << 40], 1, &[0; 8]);
        let mut g = Pb::default();
        g.msg(5, &t);
        let m = OnnxModel::parse("t.onnx", &model_with(&g)).unwrap();
        assert!(m.graph.initializer("huge").unwrap().to_f32().is_err());

        let t = tensor_raw("neg", &[-1], 1, &[0; 4]);
        let mut g = Pb::default();
        g.msg(5, &t);
        let m = OnnxModel::parse("t.onnx", &model_with(&g)).unwrap();
        assert!(m.graph.initializer("neg").unwrap().to_f32().is_err());
    }

    #[test]
    fn external_data_is_unsupported() {
        let mut t = Pb::default();
        t.int(1, 4).int(2, 1).bytes(8, b"ext").int(14, 1);
        let mut entry = Pb::default();
        entry.bytes(1, b"location").bytes(2, b"weights.bin");
        t.msg(13, &entry);
        let mut g = Pb::default();
        g.msg(5, &t);
        let m = OnnxModel::parse("t.onnx", &model_with(&g)).unwrap();
        let ext = m.graph.initializer("ext").unwrap();
        assert!(ext.is_external());
        let e = ext.to_f32().unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("external"), "{e}");
    }

    #[test]
    fn non_onnx_and_broken_files_are_clear_errors() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        let e = OnnxModel::parse("page.png", png).unwrap_err().to_string();
        assert!(e.starts_with("page.png: not an ONNX model"), "{e}");
        let e = OnnxModel::parse("x.onnx", b"").unwrap_err().to_string();
        assert!(
            e.contains("not an ONNX model") && e.contains("empty"),
            "{e}"
        );
        // Valid protobuf, but no graph.
        let mut m = Pb::default();
        m.int(1, 8);
        let e = OnnxModel::parse("x.onnx", &m.0).unwrap_err().to_string();
        assert!(e.contains("no graph"), "{e}");
        // A length prefix far past the end of the file.
        let mut m = Pb::default();
        m.int(1, 8).key(7, 2).varint(u64::MAX >> 1);
        let e = OnnxModel::parse("x.onnx", &m.0).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        // A known field with the wrong wire type.
        let mut m = Pb::default();
        m.int(1, 8).int(7, 3);
        let e = OnnxModel::parse("x.onnx", &m.0).unwrap_err().to_string();
        assert!(e.contains("expected a GraphProto message"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        // Graph -> node -> attribute -> graph -> ..., past MAX_DEPTH.
        let mut g = Pb::default();
        for _ in 0..MAX_DEPTH + 4 {
            let mut a = Pb::default();
            a.bytes(1, b"body").int(20, 5).msg(6, &g);
            let mut n = Pb::default();
            n.bytes(4, b"Loop").msg(5, &a);
            g = Pb::default();
            g.msg(1, &n);
        }
        let e = OnnxModel::parse("x.onnx", &model_with(&g)).unwrap_err();
        assert!(e.to_string().contains("nested deeper"), "{e}");
    }
}
