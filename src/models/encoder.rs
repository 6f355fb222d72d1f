//! BERT encoders (Hugging Face `BertModel`), as sentence-transformers models
//! such as all-MiniLM-L6-v2 use them: config -> weights -> CPU forward, then
//! the GPU plan.
//!
//! Forward pass (post-norm):
//!   h = LayerNorm(`word[id]` + `position[pos]` + `token_type[type]`)
//!   per layer: a = LayerNorm(h + Wo · attention(Wq h, Wk h, Wv h))
//!              h = LayerNorm(a + W2 · act(W1 a))
//! Batches are ragged: sequences of different lengths packed row after row,
//! with no padding, each attending only to itself.

use crate::cpu::{self, Activation, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::gpu::{dense, Gpu};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

/// `config.json` of a BERT checkpoint: every field the forward pass needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: Activation,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
}

/// `layer_norm_eps` when config.json leaves it out (transformers' BertConfig default).
const DEFAULT_LAYER_NORM_EPS: f32 = 1e-12;
/// `type_vocab_size` default in transformers' BertConfig.
const DEFAULT_TYPE_VOCAB_SIZE: usize = 2;

impl BertConfig {
    pub fn from_file(path: &Path) -> Result<BertConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        BertConfig::from_json(path, &text)
    }

    /// Parses and checks a config; `path` is only used in messages.
    pub fn from_json(path: &Path, text: &str) -> Result<BertConfig> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(path, format!("not valid JSON: {e}")))?;
        if !v.is_object() {
            return Err(Error::format(path, "expected a JSON object"));
        }
        if let Some(t) = v.get("model_type").and_then(Value::as_str) {
            if t != "bert" {
                return Err(Error::unsupported(
                    path,
                    format!("model_type {t:?} (this engine runs \"bert\")"),
                ));
            }
        }
        if let Some(t) = v.get("position_embedding_type").and_then(Value::as_str) {
            if t != "absolute" {
                return Err(Error::unsupported(
                    path,
                    format!("position_embedding_type {t:?} (only \"absolute\")"),
                ));
            }
        }
        let size = |key: &str, default: Option<usize>| -> Result<usize> {
            match v.get(key) {
                None | Some(Value::Null) => {
                    default.ok_or_else(|| Error::format(path, format!("missing field {key}")))
                }
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0 && n <= u32::MAX as u64)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        Error::format(path, format!("{key} is {x}, expected a positive integer"))
                    }),
            }
        };
        let act_name = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        let hidden_act = Activation::from_hf(act_name).ok_or_else(|| {
            Error::unsupported(
                path,
                format!("hidden_act {act_name:?} (gelu, gelu_new, relu)"),
            )
        })?;
        let layer_norm_eps = match v.get("layer_norm_eps") {
            None => DEFAULT_LAYER_NORM_EPS,
            Some(x) => x.as_f64().filter(|e| *e > 0.0 && *e < 1.0).ok_or_else(|| {
                Error::format(
                    path,
                    format!("layer_norm_eps is {x}, expected a small positive number"),
                )
            })? as f32,
        };
        let c = BertConfig {
            vocab_size: size("vocab_size", None)?,
            hidden_size: size("hidden_size", None)?,
            num_hidden_layers: size("num_hidden_layers", None)?,
            num_attention_heads: size("num_attention_heads", None)?,
            intermediate_size: size("intermediate_size", None)?,
            hidden_act,
            max_position_embeddings: size("max_position_embeddings", None)?,
            type_vocab_size: size("type_vocab_size", Some(DEFAULT_TYPE_VOCAB_SIZE))?,
            layer_norm_eps,
        };
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(Error::format(
                path,
                format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}",
                    c.hidden_size, c.num_attention_heads
                ),
            ));
        }
        if c.head_dim() > dense::ATTENTION_MAX_HEAD_DIM {
            return Err(Error::unsupported(
                path,
                format!(
                    "head size {} (at most {})",
                    c.head_dim(),
                    dense::ATTENTION_MAX_HEAD_DIM
                ),
            ));
        }
        Ok(c)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn attention_shape(&self) -> AttentionShape {
        let d = self.hidden_size;
        AttentionShape {
            heads: self.num_attention_heads,
            kv_heads: self.num_attention_heads,
            head_dim: self.head_dim(),
            scale: 1.0 / (self.head_dim() as f32).sqrt(),
            causal: false,
            // q, k and v are column blocks of the fused QKV projection.
            q_stride: 3 * d,
            k_stride: 3 * d,
            v_stride: 3 * d,
            q_col: 0,
            k_col: d,
            v_col: 2 * d,
        }
    }
}

/// One encoder layer. Field names follow the checkpoint's tensor names under
/// `encoder.layer.N.`; query, key and value are stacked into one projection.
pub struct BertLayer {
    /// attention.self.{query,key,value}.weight stacked: [3 d, d]
    pub qkv_w: Vec<f32>,
    /// attention.self.{query,key,value}.bias stacked: [3 d]
    pub qkv_b: Vec<f32>,
    /// attention.output.dense.weight: [d, d], .bias: `[d]`
    pub attention_output_w: Vec<f32>,
    pub attention_output_b: Vec<f32>,
    /// attention.output.LayerNorm.weight, .bias: `[d]`
    pub attention_norm_w: Vec<f32>,
    pub attention_norm_b: Vec<f32>,
    /// intermediate.dense.weight: [i, d], .bias: `[i]`
    pub intermediate_w: Vec<f32>,
    pub intermediate_b: Vec<f32>,
    /// output.dense.weight: [d, i], .bias: `[d]`
    pub output_w: Vec<f32>,
    pub output_b: Vec<f32>,
    /// output.LayerNorm.weight, .bias: `[d]`
    pub output_norm_w: Vec<f32>,
    pub output_norm_b: Vec<f32>,
}

pub struct BertWeights {
    /// embeddings.word_embeddings.weight: [vocab, d]
    pub word_embeddings: Vec<f32>,
    /// embeddings.position_embeddings.weight: [max_positions, d]
    pub position_embeddings: Vec<f32>,
    /// embeddings.token_type_embeddings.weight: [type_vocab, d]
    pub token_type_embeddings: Vec<f32>,
    /// embeddings.LayerNorm.weight, .bias: `[d]`
    pub embeddings_norm_w: Vec<f32>,
    pub embeddings_norm_b: Vec<f32>,
    pub layers: Vec<BertLayer>,
}

/// A BERT encoder: config and f32 weights on the host.
pub struct Bert {
    pub config: BertConfig,
    pub weights: BertWeights,
    /// The layers' matrices repacked for the CPU's matmul, made on first use.
    packed: OnceLock<Vec<PackedLayer>>,
}

/// One layer's matrices in [`cpu::PackedMatrix`] form.
struct PackedLayer {
    qkv: cpu::PackedMatrix,
    attention_output: cpu::PackedMatrix,
    intermediate: cpu::PackedMatrix,
    output: cpu::PackedMatrix,
}

/// Tensors of one safetensors file, read as f32 with their shapes checked.
struct Tensors<'a> {
    path: &'a Path,
    st: SafeTensors<'a>,
    /// "bert." in checkpoints saved from a task model (BertForMaskedLM, ...).
    prefix: &'static str,
}

impl Tensors<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .st
            .tensor(&full)
            .map_err(|_| Error::format(self.path, format!("tensor {full} is missing")))?;
        if t.shape() != shape {
            return Err(Error::format(
                self.path,
                format!(
                    "tensor {full} has shape {:?}, config.json implies {shape:?}",
                    t.shape()
                ),
            ));
        }
        let bytes = t.data();
        Ok(match t.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(bytes),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::unsupported(
                    self.path,
                    format!("tensor {full} has dtype {other:?} (f32, f16, bf16)"),
                ))
            }
        })
    }

    /// Several tensors of the same shape stacked along the first axis.
    fn stacked(&self, names: &[String], shape: &[usize]) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for n in names {
            out.extend(self.get(n, shape)?);
        }
        Ok(out)
    }
}

impl Bert {
    /// Reads `config.json` and `model.safetensors` from a Hugging Face model directory.
    pub fn load(dir: &Path) -> Result<Bert> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let path = dir.join("model.safetensors");
        let weights = BertWeights::load(&path, &config)?;
        Ok(Bert {
            config,
            weights,
            packed: OnceLock::new(),
        })
    }

    /// Repacks the weights for the CPU forward pass now rather than in the
    /// first call (which would then be slower than the rest).
    pub fn prepare_cpu(&self) {
        self.packed_layers();
    }

    fn packed_layers(&self) -> &[PackedLayer] {
        self.packed.get_or_init(|| {
            let (d, i) = (self.config.hidden_size, self.config.intermediate_size);
            self.weights
                .layers
                .iter()
                .map(|l| PackedLayer {
                    qkv: cpu::PackedMatrix::pack(&l.qkv_w, 3 * d, d),
                    attention_output: cpu::PackedMatrix::pack(&l.attention_output_w, d, d),
                    intermediate: cpu::PackedMatrix::pack(&l.intermediate_w, i, d),
                    output: cpu::PackedMatrix::pack(&l.output_w, d, i),
                })
                .collect()
        })
    }

    /// h: [tokens, d], the sum of word, position and token-type embeddings
    /// (before the embedding LayerNorm).
    pub fn embedding_sum(&self, batch: &Batch) -> Result<Vec<f32>> {
        let c = &self.config;
        let w = &self.weights;
        let d = c.hidden_size;
        let mut h = vec![0.0f32; batch.ids.len() * d];
        for (t, row) in h.chunks_exact_mut(d).enumerate() {
            let (id, pos, ty) = (
                batch.ids[t] as usize,
                batch.positions[t] as usize,
                batch.type_ids[t] as usize,
            );
            if id >= c.vocab_size || pos >= c.max_position_embeddings || ty >= c.type_vocab_size {
                return Err(Error::invalid(format!(
                    "token {t}: id {id}, position {pos}, type {ty} out of range for the model \
                     (vocabulary {}, {} positions, {} types)",
                    c.vocab_size, c.max_position_embeddings, c.type_vocab_size
                )));
            }
            let (we, pe, te) = (
                &w.word_embeddings[id * d..(id + 1) * d],
                &w.position_embeddings[pos * d..(pos + 1) * d],
                &w.token_type_embeddings[ty * d..(ty + 1) * d],
            );
            for i in 0..d {
                row[i] = we[i] + pe[i] + te[i];
            }
        }
        Ok(h)
    }

    /// The CPU reference forward pass: last hidden state, [tokens, d].
    pub fn forward_cpu(&self, batch: &Batch) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, inter, t) = (c.hidden_size, c.intermediate_size, batch.ids.len());
        let eps = c.layer_norm_eps;
        let w = &self.weights;
        let sum = self.embedding_sum(batch)?;
        let mut h = vec![0.0f32; t * d];
        cpu::layer_norm(
            &sum,
            &w.embeddings_norm_w,
            &w.embeddings_norm_b,
            eps,
            &mut h,
        );
        let shape = c.attention_shape();
        let mut qkv = vec![0.0f32; t * 3 * d];
        let mut ctx = vec![0.0f32; t * d];
        let mut a = vec![0.0f32; t * d];
        let mut f = vec![0.0f32; t * inter];
        for (l, p) in w.layers.iter().zip(self.packed_layers()) {
            cpu::matmul_packed(&h, &p.qkv, Some(&l.qkv_b), t, &mut qkv);
            cpu::attention(&qkv, &qkv, &qkv, &batch.seqs, &shape, &mut ctx);
            cpu::matmul_packed(
                &ctx,
                &p.attention_output,
                Some(&l.attention_output_b),
                t,
                &mut a,
            );
            cpu::add_assign(&mut a, &h);
            cpu::layer_norm(&a, &l.attention_norm_w, &l.attention_norm_b, eps, &mut h);
            cpu::matmul_packed(&h, &p.intermediate, Some(&l.intermediate_b), t, &mut f);
            c.hidden_act.apply_all_fast(&mut f);
            cpu::matmul_packed(&f, &p.output, Some(&l.output_b), t, &mut a);
            cpu::add_assign(&mut a, &h);
            cpu::layer_norm(&a, &l.output_norm_w, &l.output_norm_b, eps, &mut h);
        }
        Ok(h)
    }
}

impl BertWeights {
    pub fn load(path: &Path, c: &BertConfig) -> Result<BertWeights> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and dropped before this function
        // returns; every tensor is copied out. A file truncated underneath us
        // would fault, as for any mmap reader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let st = SafeTensors::deserialize(&map)
            .map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
        let prefix = if st.tensor("embeddings.word_embeddings.weight").is_err()
            && st.tensor("bert.embeddings.word_embeddings.weight").is_ok()
        {
            "bert."
        } else {
            ""
        };
        let ts = Tensors { path, st, prefix };
        let (d, i) = (c.hidden_size, c.intermediate_size);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for n in 0..c.num_hidden_layers {
            let p = |s: &str| format!("encoder.layer.{n}.{s}");
            let qkv = |part: &str| {
                ["query", "key", "value"].map(|x| p(&format!("attention.self.{x}.{part}")))
            };
            layers.push(BertLayer {
                qkv_w: ts.stacked(&qkv("weight"), &[d, d])?,
                qkv_b: ts.stacked(&qkv("bias"), &[d])?,
                attention_output_w: ts.get(&p("attention.output.dense.weight"), &[d, d])?,
                attention_output_b: ts.get(&p("attention.output.dense.bias"), &[d])?,
                attention_norm_w: ts.get(&p("attention.output.LayerNorm.weight"), &[d])?,
                attention_norm_b: ts.get(&p("attention.output.LayerNorm.bias"), &[d])?,
                intermediate_w: ts.get(&p("intermediate.dense.weight"), &[i, d])?,
                intermediate_b: ts.get(&p("intermediate.dense.bias"), &[i])?,
                output_w: ts.get(&p("output.dense.weight"), &[d, i])?,
                output_b: ts.get(&p("output.dense.bias"), &[d])?,
                output_norm_w: ts.get(&p("output.LayerNorm.weight"), &[d])?,
                output_norm_b: ts.get(&p("output.LayerNorm.bias"), &[d])?,
            });
        }
        if ts
            .st
            .tensor(&format!(
                "{prefix}encoder.layer.{}.output.dense.weight",
                c.num_hidden_layers
            ))
            .is_ok()
        {
            return Err(Error::format(
                path,
                format!(
                    "holds more than the {} layers config.json declares",
                    c.num_hidden_layers
                ),
            ));
        }
        Ok(BertWeights {
            word_embeddings: ts.get("embeddings.word_embeddings.weight", &[c.vocab_size, d])?,
            position_embeddings: ts.get(
                "embeddings.position_embeddings.weight",
                &[c.max_position_embeddings, d],
            )?,
            token_type_embeddings: ts.get(
                "embeddings.token_type_embeddings.weight",
                &[c.type_vocab_size, d],
            )?,
            embeddings_norm_w: ts.get("embeddings.LayerNorm.weight", &[d])?,
            embeddings_norm_b: ts.get("embeddings.LayerNorm.bias", &[d])?,
            layers,
        })
    }
}

/// A ragged batch of token sequences, packed row after row.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// `[tokens]`
    pub ids: Vec<u32>,
    /// `[tokens]`: 0 for single sentences
    pub type_ids: Vec<u32>,
    /// `[tokens]`: position within its sequence
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqSpan>,
}

impl Batch {
    /// Packs single-sentence sequences (token type 0, positions from 0).
    pub fn new<S: AsRef<[u32]>>(sequences: &[S]) -> Batch {
        let mut b = Batch::default();
        for s in sequences {
            let s = s.as_ref();
            b.seqs.push(SeqSpan::same(b.ids.len(), s.len()));
            b.ids.extend_from_slice(s);
            b.type_ids.extend(std::iter::repeat_n(0, s.len()));
            b.positions.extend(0..s.len() as u32);
        }
        b
    }

    pub fn tokens(&self) -> usize {
        self.ids.len()
    }
}

/// A BERT encoder with its weights on the GPU: the same forward pass as
/// [`Bert::forward_cpu`], recorded into one submission per batch.
pub struct GpuBert {
    config: BertConfig,
    layers: Vec<GpuLayer>,
    embeddings_norm_w: wgpu::Buffer,
    embeddings_norm_b: wgpu::Buffer,
}

struct GpuLayer {
    qkv_w: wgpu::Buffer,
    qkv_b: wgpu::Buffer,
    attention_output_w: wgpu::Buffer,
    attention_output_b: wgpu::Buffer,
    attention_norm_w: wgpu::Buffer,
    attention_norm_b: wgpu::Buffer,
    intermediate_w: wgpu::Buffer,
    intermediate_b: wgpu::Buffer,
    output_w: wgpu::Buffer,
    output_b: wgpu::Buffer,
    output_norm_w: wgpu::Buffer,
    output_norm_b: wgpu::Buffer,
}

impl GpuBert {
    /// Uploads the encoder weights (the embedding tables stay on the host:
    /// the lookup is done there and only the summed rows are uploaded).
    pub fn new(gpu: &Gpu, model: &Bert) -> Result<GpuBert> {
        let up = |name: String, data: &[f32]| gpu.upload_f32(&name, data);
        let mut layers = Vec::new();
        for (n, l) in model.weights.layers.iter().enumerate() {
            let name = |s: &str| format!("encoder.layer.{n}.{s}");
            layers.push(GpuLayer {
                qkv_w: up(name("qkv.weight"), &l.qkv_w)?,
                qkv_b: up(name("qkv.bias"), &l.qkv_b)?,
                attention_output_w: up(
                    name("attention.output.dense.weight"),
                    &l.attention_output_w,
                )?,
                attention_output_b: up(name("attention.output.dense.bias"), &l.attention_output_b)?,
                attention_norm_w: up(
                    name("attention.output.LayerNorm.weight"),
                    &l.attention_norm_w,
                )?,
                attention_norm_b: up(name("attention.output.LayerNorm.bias"), &l.attention_norm_b)?,
                intermediate_w: up(name("intermediate.dense.weight"), &l.intermediate_w)?,
                intermediate_b: up(name("intermediate.dense.bias"), &l.intermediate_b)?,
                output_w: up(name("output.dense.weight"), &l.output_w)?,
                output_b: up(name("output.dense.bias"), &l.output_b)?,
                output_norm_w: up(name("output.LayerNorm.weight"), &l.output_norm_w)?,
                output_norm_b: up(name("output.LayerNorm.bias"), &l.output_norm_b)?,
            });
        }
        let w = &model.weights;
        let gpu_model = GpuBert {
            config: model.config.clone(),
            layers,
            embeddings_norm_w: up("embeddings.LayerNorm.weight".into(), &w.embeddings_norm_w)?,
            embeddings_norm_b: up("embeddings.LayerNorm.bias".into(), &w.embeddings_norm_b)?,
        };
        // One tiny pass compiles every pipeline (some drivers only finish
        // compiling at the first dispatch), so the first real batch is as
        // fast as the rest.
        let d = model.config.hidden_size;
        gpu_model.forward(gpu, &Batch::new(&[[0u32, 0]]), &vec![0.0; 2 * d])?;
        Ok(gpu_model)
    }

    /// Most tokens one submission may hold: the largest activation,
    /// [tokens, max(3 d, intermediate)] f32, must fit one storage binding.
    pub fn max_tokens(&self, gpu: &Gpu) -> usize {
        let c = &self.config;
        let widest = (3 * c.hidden_size).max(c.intermediate_size) as u64 * 4;
        (gpu.caps.max_binding / widest) as usize
    }

    /// Last hidden state, [tokens, d]. `sum` is [`Bert::embedding_sum`] of
    /// `batch`; the batch must hold at most [`GpuBert::max_tokens`] tokens.
    pub fn forward(&self, gpu: &Gpu, batch: &Batch, sum: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, inter, t) = (c.hidden_size, c.intermediate_size, batch.tokens());
        if t == 0 {
            return Ok(Vec::new());
        }
        if t > self.max_tokens(gpu) {
            return Err(Error::invalid(format!(
                "batch of {t} tokens is over the {} this adapter can hold in one pass",
                self.max_tokens(gpu)
            )));
        }
        let eps = c.layer_norm_eps;
        let bytes = |n: usize| (n * 4) as u64;
        let x = gpu.upload_f32("embedding sum", sum)?;
        let h = gpu.scratch("hidden", bytes(t * d))?;
        let h1 = gpu.scratch("attention hidden", bytes(t * d))?;
        let qkv = gpu.scratch("qkv", bytes(t * 3 * d))?;
        let ctx = gpu.scratch("context", bytes(t * d))?;
        let a = gpu.scratch("residual sum", bytes(t * d))?;
        let f = gpu.scratch("intermediate", bytes(t * inter))?;
        let seqs = gpu.upload_u32("sequences", &dense::pack_seqs(&batch.seqs))?;
        let shape = c.attention_shape();
        let norm = |x: &wgpu::Buffer, w: &wgpu::Buffer, b: &wgpu::Buffer, y: &wgpu::Buffer| {
            dense::layer_norm(gpu, &gpu.reduce_variant(), x, w, b, y, d, t, eps)
        };
        let mut work = vec![norm(
            &x,
            &self.embeddings_norm_w,
            &self.embeddings_norm_b,
            &h,
        )?];
        for l in &self.layers {
            let linear = |x, w, b, y, k, n| dense::Linear {
                x,
                w,
                format: dense::WeightFormat::F32,
                bias: Some(b),
                residual: None,
                y,
                m: t,
                k,
                n,
                act: None,
            };
            work.push(dense::matmul(
                gpu,
                &linear(&h, &l.qkv_w, &l.qkv_b, &qkv, d, 3 * d),
            )?);
            work.push(dense::attention(
                gpu,
                &qkv,
                &qkv,
                &qkv,
                &seqs,
                &batch.seqs,
                &shape,
                &ctx,
            )?);
            work.push(dense::matmul(
                gpu,
                &dense::Linear {
                    residual: Some(&h),
                    ..linear(&ctx, &l.attention_output_w, &l.attention_output_b, &a, d, d)
                },
            )?);
            work.push(norm(&a, &l.attention_norm_w, &l.attention_norm_b, &h1)?);
            work.push(dense::matmul(
                gpu,
                &dense::Linear {
                    act: Some(c.hidden_act),
                    ..linear(&h1, &l.intermediate_w, &l.intermediate_b, &f, d, inter)
                },
            )?);
            work.push(dense::matmul(
                gpu,
                &dense::Linear {
                    residual: Some(&h1),
                    ..linear(&f, &l.output_w, &l.output_b, &a, inter, d)
                },
            )?);
            work.push(norm(&a, &l.output_norm_w, &l.output_norm_b, &h)?);
        }
        gpu.run_all(&work.iter().collect::<Vec<_>>())?;
        let mut out = gpu.read_f32(&h)?;
        out.truncate(t * d);
        Ok(out)
    }
}
