//! Converting a checkpoint into a GGUF file, tensor by tensor: the flow
//! behind `gguf-write` and `quantize`.
//!
//! [`plan`] opens the input (an HF directory, a GGUF file, or a bare
//! safetensors file), decides each tensor's output type with a
//! [`Policy`], and lays out the metadata; [`write()`] then streams the file:
//! one tensor is read (memory-mapped), dequantised to f32 when its type
//! changes, quantised row-parallel on every core, written, and dropped
//! before the next, so memory stays near the size of the largest tensor.

use crate::error::{Error, Result};
use crate::formats::gguf::{GgufFile, Value};
use crate::formats::gguf_stream::{GgufStreamWriter, TensorDecl};
use crate::formats::safetensors::Safetensors;
use crate::formats::TensorSource;
use crate::models::gguf_export::{ExportOptions, HfExport, QUANTIZATION_VERSION};
use crate::quant::policy::{positions, Policy, Position};
use crate::quant::GgmlType;
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// What the input is.
pub enum Input {
    /// An HF directory (or its `model.safetensors`), written with llama.cpp's
    /// names and metadata.
    Hf(Box<HfExport>),
    /// A GGUF file: metadata and names are kept.
    Gguf(GgufFile),
    /// A safetensors file without a config beside it: names are kept and
    /// the output has no model metadata.
    Tensors(Safetensors),
}

/// One tensor of the output.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    /// Type in the input.
    pub from: GgmlType,
    /// Type in the output.
    pub to: GgmlType,
    /// The type the policy asked for, when the rows did not fit its blocks.
    pub fell_back_from: Option<GgmlType>,
    /// Index into the HF export's tensors (HF input only).
    export_index: Option<usize>,
}

pub struct Plan {
    pub input_path: PathBuf,
    pub input: Input,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<PlannedTensor>,
}

#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Quantise tensors that are already quantised to another block format
    /// (llama-quantize's `--allow-requantize`); dequantising to a float type
    /// needs no permission.
    pub allow_requantize: bool,
    /// `tokenizer.ggml.pre` for HF input, instead of the recognised one.
    pub tokenizer_pre: Option<String>,
}

/// Opens `path` as an HF directory, a GGUF file or a safetensors file (an
/// HF directory when a config.json sits beside it).
pub fn open_input(path: &Path, policy: &Policy, opts: &PlanOptions) -> Result<Input> {
    if !path.exists() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    let export = |dir: &Path| -> Result<Input> {
        let eo = ExportOptions {
            tokenizer_pre: opts.tokenizer_pre.clone(),
            file_type: policy.file_type(),
        };
        Ok(Input::Hf(Box::new(HfExport::open(dir, &eo)?)))
    };
    if path.is_dir() {
        return export(path);
    }
    let mut magic = [0u8; 4];
    let n = std::io::Read::read(
        &mut std::fs::File::open(path).map_err(|e| Error::io(path, e))?,
        &mut magic,
    )
    .map_err(|e| Error::io(path, e))?;
    if n == 4 && &magic == crate::formats::gguf::MAGIC {
        return Ok(Input::Gguf(GgufFile::open(path)?));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let is_model_file = path.file_name().is_some_and(|n| {
        n == crate::formats::safetensors::SINGLE_FILE
            || n == crate::formats::safetensors::INDEX_FILE
    });
    if is_model_file && dir.join(crate::formats::hf::CONFIG_FILE).is_file() {
        return export(dir);
    }
    Ok(Input::Tensors(Safetensors::open(path)?))
}

/// Plans the output of converting `path` under `policy`.
pub fn plan(path: &Path, policy: &Policy, opts: &PlanOptions) -> Result<Plan> {
    let input = open_input(path, policy, opts)?;
    let file_type = policy.file_type();
    let (metadata, tensors) = match &input {
        Input::Hf(e) => {
            let names: Vec<&str> = e.tensors.iter().map(|t| t.name.as_str()).collect();
            let at = positions(&names);
            let tensors = e
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    // The converter writes never-quantised tensors as F32.
                    let c =
                        policy.choose_at(&t.name, &t.shape, t.source_dtype, GgmlType::F32, at[i]);
                    PlannedTensor {
                        name: t.name.clone(),
                        shape: t.shape.clone(),
                        from: t.source_dtype,
                        to: c.dtype,
                        fell_back_from: c.fell_back_from,
                        export_index: Some(i),
                    }
                })
                .collect();
            (e.metadata.clone(), tensors)
        }
        Input::Gguf(g) => {
            let mut meta = g.metadata().to_vec();
            set_in_place(
                &mut meta,
                "general.quantization_version",
                Value::U32(QUANTIZATION_VERSION),
            );
            set_in_place(&mut meta, "general.file_type", Value::U32(file_type));
            let infos = g.tensor_infos();
            let names: Vec<&str> = infos.iter().map(|t| t.name.as_str()).collect();
            let at = positions(&names);
            let tensors = infos
                .iter()
                .zip(at)
                .map(|(t, at)| planned(policy, &t.name, &t.shape, t.dtype, at))
                .collect();
            (meta, tensors)
        }
        Input::Tensors(s) => {
            let meta = vec![
                ("general.type".to_string(), Value::from("model")),
                ("general.file_type".to_string(), Value::U32(file_type)),
                (
                    "general.quantization_version".to_string(),
                    Value::U32(QUANTIZATION_VERSION),
                ),
            ];
            let mut tensors = Vec::new();
            let names = s.names();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            for (name, at) in names.iter().zip(positions(&refs)) {
                // Reading the header entry checks the dtype (F32/F16/BF16).
                let t = s.tensor(name)?;
                tensors.push(planned(policy, name, &t.shape, t.dtype, at));
            }
            (meta, tensors)
        }
    };
    if !opts.allow_requantize {
        if let Some(t) = tensors
            .iter()
            .find(|t| t.from.is_quantized() && t.to.is_quantized() && t.to != t.from)
        {
            return Err(Error::invalid(format!(
                "{}: tensor '{}' is already {}; quantising it again to {} loses more than \
                 quantising the original (pass --allow-requantize to do it anyway)",
                path.display(),
                t.name,
                t.from,
                t.to
            )));
        }
    }
    Ok(Plan {
        input_path: path.to_path_buf(),
        input,
        metadata,
        tensors,
    })
}

/// A tensor kept under its own name: never-quantised ones keep their type.
fn planned(
    policy: &Policy,
    name: &str,
    shape: &[usize],
    from: GgmlType,
    at: Position,
) -> PlannedTensor {
    let c = policy.choose_at(name, shape, from, from, at);
    PlannedTensor {
        name: name.to_string(),
        shape: shape.to_vec(),
        from,
        to: c.dtype,
        fell_back_from: c.fell_back_from,
        export_index: None,
    }
}

fn set_in_place(meta: &mut Vec<(String, Value)>, key: &str, value: Value) {
    match meta.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => meta.push((key.to_string(), value)),
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    pub tensors: usize,
    pub params: usize,
    /// Tensor bytes in the input and in the output.
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub seconds: f64,
}

impl Plan {
    /// The output tensor `t` as bytes of its output type.
    fn convert(&self, t: &PlannedTensor) -> Result<Tensor> {
        let (source, values) = match (&self.input, t.export_index) {
            (Input::Hf(e), Some(i)) => {
                let et = &e.tensors[i];
                let source = e.source_tensor(et)?;
                if t.to == t.from
                    && et.rope_permute.is_none()
                    && et.shift == 0.0
                    && source.shape == t.shape
                {
                    return Ok(source);
                }
                (source, Some(e.read_f32(et)?))
            }
            (Input::Gguf(g), _) => (g.tensor(&t.name)?, None),
            (Input::Tensors(s), _) => (s.tensor(&t.name)?, None),
            (Input::Hf(_), None) => unreachable!("HF plans index the export"),
        };
        if t.to == source.dtype && values.is_none() {
            return Ok(source);
        }
        let values = values.unwrap_or_else(|| source.to_f32());
        Tensor::quantize_f32(t.name.clone(), t.shape.clone(), &values, t.to)
    }
}

/// Writes the planned file to `out` (refused when it exists unless
/// `overwrite`); `progress` is called after each tensor with its index.
pub fn write(
    plan: &Plan,
    out: &Path,
    overwrite: bool,
    mut progress: impl FnMut(usize),
) -> Result<Written> {
    let start = std::time::Instant::now();
    if same_file(&plan.input_path, out) {
        return Err(Error::invalid(format!(
            "{}: the output would replace the input",
            out.display()
        )));
    }
    let decls: Vec<TensorDecl> = plan
        .tensors
        .iter()
        .map(|t| TensorDecl {
            name: t.name.clone(),
            dtype: t.to,
            shape: t.shape.clone(),
        })
        .collect();
    let mut w = GgufStreamWriter::create(out, overwrite, &plan.metadata, &decls)?;
    let mut done = Written {
        tensors: 0,
        params: 0,
        bytes_in: 0,
        bytes_out: 0,
        seconds: 0.0,
    };
    for (i, t) in plan.tensors.iter().enumerate() {
        let converted = plan.convert(t)?;
        w.write_tensor(&t.name, converted.bytes())?;
        let numel: usize = t.shape.iter().product();
        done.tensors += 1;
        done.params += numel;
        done.bytes_in += crate::tensor::tensor_bytes(t.from, &t.shape).unwrap_or(0);
        done.bytes_out += converted.bytes().len();
        progress(i);
    }
    w.finish()?;
    done.seconds = start.elapsed().as_secs_f64();
    Ok(done)
}

/// Whether two paths name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
