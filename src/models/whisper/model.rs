//! The Whisper network: config -> weights -> CPU forward.
//!
//! Encoder: conv1 (k3, pad 1) and GELU, conv2 (k3, stride 2, pad 1) and
//! GELU, plus sinusoidal positions; pre-norm transformer layers; a final
//! LayerNorm.
//! Decoder: token + learned positions, pre-norm layers of causal
//! self-attention (KV-cached), cross-attention to the encoder output and an
//! MLP; final LayerNorm; logits against the token embedding (shared output
//! embedding). LayerNorm eps 1e-5, exact GELU, as in openai-whisper.
//!
//! Weights are read from a CTranslate2 `model.bin` (names verbatim) and
//! widened to f32: CT2 fuses q/k/v (`self_attention/linear_0`) and the
//! cross-attention k/v (`attention/linear_1`), with a zero bias for k.

use crate::cpu::{self, AttentionShape, SeqSpan};
use crate::error::{Error, Result};
use crate::formats::ct2::Ct2File;
use crate::quant::fast::gemm8;
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::sync::OnceLock;

pub const LN_EPS: f32 = 1e-5;

/// Sizes, read from the tensors of the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub n_mels: usize,
    /// Encoder positions (1500 for 30 s).
    pub n_audio_ctx: usize,
    pub d_model: usize,
    pub n_audio_layers: usize,
    pub n_audio_heads: usize,
    /// Decoder positions (448).
    pub n_text_ctx: usize,
    pub n_text_layers: usize,
    pub n_text_heads: usize,
    pub n_vocab: usize,
    pub d_ff: usize,
}

impl Config {
    pub fn from_ct2(f: &Ct2File) -> Result<Config> {
        let shape = |name: &str| -> Result<Vec<usize>> {
            f.variable(name).map(|v| v.shape.clone()).ok_or_else(|| {
                Error::format(
                    f.path(),
                    format!("missing variable {name} (not a Whisper model?)"),
                )
            })
        };
        let conv1 = shape("encoder/conv1/weight")?;
        let enc_pos = shape("encoder/position_encodings/encodings")?;
        let emb = shape("decoder/embeddings/weight")?;
        let dec_pos = shape("decoder/position_encodings/encodings")?;
        let ff = shape("encoder/layer_0/ffn/linear_0/weight")?;
        let count = |prefix: &str| {
            (0..)
                .take_while(|i| {
                    f.variable(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))
                        .is_some()
                })
                .count()
        };
        if conv1.len() != 3
            || enc_pos.len() != 2
            || emb.len() != 2
            || dec_pos.len() != 2
            || ff.len() != 2
        {
            return Err(Error::format(
                f.path(),
                "unexpected tensor ranks for a Whisper model",
            ));
        }
        let heads = |name: &str| -> Result<usize> {
            let h = f.scalar_i64(name)?;
            usize::try_from(h)
                .ok()
                .filter(|&h| h > 0)
                .ok_or_else(|| Error::format(f.path(), format!("{name} = {h}")))
        };
        let c = Config {
            n_mels: conv1[1],
            n_audio_ctx: enc_pos[0],
            d_model: conv1[0],
            n_audio_layers: count("encoder"),
            n_audio_heads: heads("encoder/num_heads")?,
            n_text_ctx: dec_pos[0],
            n_text_layers: count("decoder"),
            n_text_heads: heads("decoder/num_heads")?,
            n_vocab: emb[0],
            d_ff: ff[0],
        };
        let d = c.d_model;
        let ok = conv1[2] == 3
            && enc_pos[1] == d
            && emb[1] == d
            && dec_pos[1] == d
            && d.is_multiple_of(c.n_audio_heads)
            && d.is_multiple_of(c.n_text_heads)
            && c.n_audio_layers > 0
            && c.n_text_layers > 0;
        if !ok {
            return Err(Error::format(
                f.path(),
                format!("inconsistent Whisper sizes {c:?}"),
            ));
        }
        // CT2's generic decoder options that Whisper never changes: refuse
        // a file that sets them otherwise instead of computing nonsense.
        for (name, want) in [
            ("decoder/pre_norm", 1),
            ("decoder/activation", 3),
            ("decoder/alibi", 0),
        ] {
            if let Some(v) = f.variable(name).map(|_| f.scalar_i64(name)).transpose()? {
                if v != want {
                    return Err(Error::unsupported(
                        f.path(),
                        format!("{name} = {v} (Whisper uses {want})"),
                    ));
                }
            }
        }
        Ok(c)
    }

    pub fn is_multilingual(&self) -> bool {
        self.n_vocab >= 51865
    }
}

/// What the CPU decoder computes its products in, with faster-whisper's
/// `compute_type` names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeType {
    /// f32 weights and inputs: the reference.
    #[default]
    Float32,
    /// CTranslate2's int8 on x86 ([`gemm8`]): the encoder's and the
    /// decoder's linears (the cross-attention keys and values included)
    /// and the vocabulary head with weight rows and input rows rounded to
    /// 8-bit levels, one scale a row; the token embeddings are the head's
    /// levels scaled back; the convolutions and the attention products
    /// stay f32.
    Int8,
}

/// y = x W^T + b, W in the PyTorch `[out, in]` layout.
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub n_out: usize,
    pub n_in: usize,
    /// `w` repacked for the CPU GEMM, on the first CPU forward (a GPU run
    /// never pays for it).
    packed: OnceLock<cpu::PackedMatrix>,
    /// `w` in int8 rows when the layer computes in int8
    /// ([`Whisper::set_compute_type`]): `forward` then uses it.
    q8: Option<gemm8::PackedI8>,
}

impl Linear {
    fn load(f: &Ct2File, prefix: &str, n_out: usize, n_in: usize) -> Result<Linear> {
        let w = f.f32(&format!("{prefix}/weight"), &[n_out, n_in])?;
        let bias = format!("{prefix}/bias");
        let b = match f.variable(&bias) {
            Some(_) => Some(f.f32(&bias, &[n_out])?),
            None => None,
        };
        Ok(Linear::new(w, b, n_out, n_in))
    }

    fn new(w: Vec<f32>, b: Option<Vec<f32>>, n_out: usize, n_in: usize) -> Linear {
        assert_eq!(w.len(), n_out * n_in, "Linear: w is not [n_out, n_in]");
        Linear {
            w,
            b,
            n_out,
            n_in,
            packed: OnceLock::new(),
            q8: None,
        }
    }

    /// Computes in `ct` from now on: int8 quantises `w` row by row (fails
    /// when a row is not whole blocks of 32), float32 drops the levels.
    fn set_compute_type(&mut self, ct: ComputeType) -> Result<()> {
        self.q8 = match ct {
            ComputeType::Float32 => None,
            ComputeType::Int8 => Some(int8_rows("whisper linear", &self.w, self.n_out, self.n_in)?),
        };
        Ok(())
    }

    /// The packed weights, packed now if not yet.
    fn packed(&self) -> &cpu::PackedMatrix {
        self.packed
            .get_or_init(|| cpu::PackedMatrix::pack(&self.w, self.n_out, self.n_in))
    }

    /// x: [rows, n_in] -> [rows, n_out], through the packed GEMM (equal to
    /// `cpu::matmul` up to the order of the additions), or in int8
    /// ([`gemm8::matmul`]).
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let rows = x.len() / self.n_in;
        let mut y = vec![0.0; rows * self.n_out];
        match &self.q8 {
            None => cpu::matmul_packed(x, self.packed(), self.b.as_deref(), rows, &mut y),
            Some(q) => {
                gemm8::matmul(q, x, rows, &mut y);
                if let Some(b) = &self.b {
                    y.chunks_exact_mut(self.n_out)
                        .for_each(|r| cpu::add_assign(r, b));
                }
            }
        }
        y
    }
}

/// `w` `[n, k]` quantised for [`gemm8::matmul`]; `name` says whose
/// weights are not whole blocks of 32.
fn int8_rows(name: &str, w: &[f32], n: usize, k: usize) -> Result<gemm8::PackedI8> {
    if !k.is_multiple_of(32) {
        return Err(Error::invalid(format!(
            "{name}: rows of {k} are not whole blocks of 32, which int8 needs"
        )));
    }
    Ok(gemm8::PackedI8::quantize(w, n, k))
}

pub struct LayerNorm {
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
}

impl LayerNorm {
    fn load(f: &Ct2File, prefix: &str, d: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: f.f32(&format!("{prefix}/gamma"), &[d])?,
            beta: f.f32(&format!("{prefix}/beta"), &[d])?,
        })
    }

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        cpu::layer_norm(x, &self.gamma, &self.beta, LN_EPS, &mut y);
        y
    }
}

/// Pre-norm MLP: fc2(gelu(fc1(ln(x)))).
pub struct Mlp {
    pub norm: LayerNorm,
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Mlp {
    fn set_compute_type(&mut self, ct: ComputeType) -> Result<()> {
        self.fc1.set_compute_type(ct)?;
        self.fc2.set_compute_type(ct)
    }

    fn load(f: &Ct2File, prefix: &str, c: &Config) -> Result<Mlp> {
        Ok(Mlp {
            norm: LayerNorm::load(f, &format!("{prefix}/layer_norm"), c.d_model)?,
            fc1: Linear::load(f, &format!("{prefix}/linear_0"), c.d_ff, c.d_model)?,
            fc2: Linear::load(f, &format!("{prefix}/linear_1"), c.d_model, c.d_ff)?,
        })
    }

    /// x += mlp(x)
    fn forward(&self, x: &mut [f32]) {
        let mut h = self.fc1.forward(&self.norm.forward(x));
        cpu::gelu_fast_all(&mut h);
        cpu::add_assign(x, &self.fc2.forward(&h));
    }
}

pub struct EncoderLayer {
    pub attn_norm: LayerNorm,
    /// [3d, d]: q, k, v stacked.
    pub qkv: Linear,
    pub out: Linear,
    pub mlp: Mlp,
}

pub struct Encoder {
    /// [d, n_mels, 3] seen as [d, n_mels * 3]: a matmul after im2col.
    pub conv1: Linear,
    /// [d, d, 3] seen as [d, d * 3].
    pub conv2: Linear,
    /// [n_audio_ctx, d]
    pub positions: Vec<f32>,
    pub layers: Vec<EncoderLayer>,
    pub norm: LayerNorm,
    compute: ComputeType,
}

pub struct DecoderLayer {
    pub self_norm: LayerNorm,
    /// [3d, d]
    pub self_qkv: Linear,
    pub self_out: Linear,
    pub cross_norm: LayerNorm,
    pub cross_q: Linear,
    /// [2d, d], applied to the encoder output once per window.
    pub cross_kv: Linear,
    pub cross_out: Linear,
    pub mlp: Mlp,
}

pub struct Decoder {
    /// [n_vocab, d], also the output projection.
    pub embedding: Vec<f32>,
    /// [n_text_ctx, d]
    pub positions: Vec<f32>,
    pub layers: Vec<DecoderLayer>,
    pub norm: LayerNorm,
    /// `embedding` as the CPU's head, made on its first use.
    head: OnceLock<Head>,
    compute: ComputeType,
}

/// The output projection on the CPU. Every decoding step reads all of it
/// (51,864 x d), so its bytes are the step's cost: when each value is an
/// f16 (as in CTranslate2's f16 checkpoints, which hold them so) it is kept
/// as f16, half the bytes, and widened exactly tile by tile. In int8 it is
/// int8 rows ([`gemm8`]).
enum Head {
    Half(Vec<f16>),
    Packed(cpu::PackedMatrix),
    Int8(gemm8::PackedI8),
}

/// Rows of the f16 head widened at a time (64 x d f32: fits in L2).
const HEAD_TILE: usize = 64;

impl Head {
    fn new(w: &[f32], n: usize, k: usize) -> Head {
        let half: Vec<f16> = w.par_iter().map(|&v| f16::from_f32(v)).collect();
        let exact = half
            .par_iter()
            .zip(w.par_iter())
            .all(|(h, &v)| h.to_f32().to_bits() == v.to_bits());
        if exact {
            Head::Half(half)
        } else {
            Head::Packed(cpu::PackedMatrix::pack(w, n, k))
        }
    }

    /// y[m, n] = x[m, k] . w[n, k]^T
    fn forward(&self, x: &[f32], n: usize, k: usize, y: &mut [f32]) {
        let m = x.len() / k;
        if m == 0 {
            return;
        }
        match self {
            Head::Packed(p) => cpu::matmul_packed(x, p, None, m, y),
            Head::Int8(q) => gemm8::matmul(q, x, m, y),
            Head::Half(w) => {
                // [n, m], tile by tile, then transposed into y.
                let mut yt = vec![0.0f32; n * m];
                yt.par_chunks_mut(HEAD_TILE * m).enumerate().for_each_init(
                    || vec![0.0f32; HEAD_TILE * k],
                    |wf, (t, out)| {
                        let (r0, nr) = (t * HEAD_TILE, out.len() / m);
                        let wf = &mut wf[..nr * k];
                        w[r0 * k..(r0 + nr) * k].convert_to_f32_slice(wf);
                        crate::quant::fast::dot_tile(x, wf, k, out);
                    },
                );
                for (j, col) in yt.chunks_exact(m).enumerate() {
                    for (i, &v) in col.iter().enumerate() {
                        y[i * n + j] = v;
                    }
                }
            }
        }
    }
}

pub struct Whisper {
    pub config: Config,
    pub encoder: Encoder,
    pub decoder: Decoder,
}

impl Whisper {
    pub fn from_ct2(f: &Ct2File) -> Result<Whisper> {
        let c = Config::from_ct2(f)?;
        let d = c.d_model;
        let encoder = Encoder {
            conv1: Linear::new(
                f.f32("encoder/conv1/weight", &[d, c.n_mels, 3])?,
                Some(f.f32("encoder/conv1/bias", &[d])?),
                d,
                c.n_mels * 3,
            ),
            conv2: Linear::new(
                f.f32("encoder/conv2/weight", &[d, d, 3])?,
                Some(f.f32("encoder/conv2/bias", &[d])?),
                d,
                d * 3,
            ),
            positions: f.f32("encoder/position_encodings/encodings", &[c.n_audio_ctx, d])?,
            layers: (0..c.n_audio_layers)
                .map(|i| {
                    let p = format!("encoder/layer_{i}");
                    Ok(EncoderLayer {
                        attn_norm: LayerNorm::load(
                            f,
                            &format!("{p}/self_attention/layer_norm"),
                            d,
                        )?,
                        qkv: Linear::load(f, &format!("{p}/self_attention/linear_0"), 3 * d, d)?,
                        out: Linear::load(f, &format!("{p}/self_attention/linear_1"), d, d)?,
                        mlp: Mlp::load(f, &format!("{p}/ffn"), &c)?,
                    })
                })
                .collect::<Result<_>>()?,
            norm: LayerNorm::load(f, "encoder/layer_norm", d)?,
            compute: ComputeType::Float32,
        };
        let decoder = Decoder {
            embedding: f.f32("decoder/embeddings/weight", &[c.n_vocab, d])?,
            positions: f.f32("decoder/position_encodings/encodings", &[c.n_text_ctx, d])?,
            layers: (0..c.n_text_layers)
                .map(|i| {
                    let p = format!("decoder/layer_{i}");
                    Ok(DecoderLayer {
                        self_norm: LayerNorm::load(
                            f,
                            &format!("{p}/self_attention/layer_norm"),
                            d,
                        )?,
                        self_qkv: Linear::load(
                            f,
                            &format!("{p}/self_attention/linear_0"),
                            3 * d,
                            d,
                        )?,
                        self_out: Linear::load(f, &format!("{p}/self_attention/linear_1"), d, d)?,
                        cross_norm: LayerNorm::load(f, &format!("{p}/attention/layer_norm"), d)?,
                        cross_q: Linear::load(f, &format!("{p}/attention/linear_0"), d, d)?,
                        cross_kv: Linear::load(f, &format!("{p}/attention/linear_1"), 2 * d, d)?,
                        cross_out: Linear::load(f, &format!("{p}/attention/linear_2"), d, d)?,
                        mlp: Mlp::load(f, &format!("{p}/ffn"), &c)?,
                    })
                })
                .collect::<Result<_>>()?,
            norm: LayerNorm::load(f, "decoder/layer_norm", d)?,
            head: OnceLock::new(),
            compute: ComputeType::Float32,
        };
        // The output projection must be the embedding (CT2 writes it as an alias).
        if let Some(v) = f.variable("decoder/projection/weight") {
            if v.shape != [c.n_vocab, d] {
                return Err(Error::format(
                    f.path(),
                    "decoder/projection/weight has the wrong shape",
                ));
            }
            if f.variable("decoder/projection/bias").is_some() {
                return Err(Error::unsupported(
                    f.path(),
                    "a bias on the output projection",
                ));
            }
        }
        Ok(Whisper {
            config: c,
            encoder,
            decoder,
        })
    }

    /// Makes the CPU encoder and decoder compute in `ct` (quantising their
    /// weights for int8, at once, so a transcription's time does not
    /// include it). The GPU backends read the f32 weights and ignore it.
    pub fn set_compute_type(&mut self, ct: ComputeType) -> Result<()> {
        self.encoder.set_compute_type(ct)?;
        self.decoder.set_compute_type(&self.config, ct)
    }
}

/// im2col for a 1-D convolution: x holds `channels` series of `t_in` steps,
/// element (t, c) at `t * t_stride + c * c_stride`; the result is
/// [t_out, channels * kernel] with cols[t, c * kernel + k] = x(t * stride + k - pad, c)
/// (zero outside 0..t_in), so the convolution is one matmul against the
/// PyTorch `[out, in, kernel]` weight.
#[allow(clippy::too_many_arguments)]
pub fn im2col_1d(
    x: &[f32],
    t_in: usize,
    channels: usize,
    t_stride: usize,
    c_stride: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    t_out: usize,
) -> Vec<f32> {
    let width = channels * kernel;
    let mut cols = vec![0.0; t_out * width];
    cols.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(t, row)| {
            for c in 0..channels {
                for k in 0..kernel {
                    let s = (t * stride + k) as isize - pad as isize;
                    if (0..t_in as isize).contains(&s) {
                        row[c * kernel + k] = x[s as usize * t_stride + c * c_stride];
                    }
                }
            }
        });
    cols
}

/// Whisper's attention layout: `heads` heads of d / heads, scaled by
/// 1 / sqrt(head_dim), q/k/v read from fused rows.
fn attention_shape(
    d: usize,
    heads: usize,
    causal: bool,
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
) -> AttentionShape {
    let head_dim = d / heads;
    AttentionShape {
        heads,
        kv_heads: heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        causal,
        window: 0,
        q_stride: q.0,
        q_col: q.1,
        k_stride: k.0,
        k_col: k.1,
        v_stride: v.0,
        v_col: v.1,
    }
}

impl Encoder {
    /// Computes the layers' linears in `ct` from now on (the convolutions
    /// stay f32: conv1's rows of 240 are not whole blocks of 32, and both
    /// are a small part of an encode).
    fn set_compute_type(&mut self, ct: ComputeType) -> Result<()> {
        for l in &mut self.layers {
            l.qkv.set_compute_type(ct)?;
            l.out.set_compute_type(ct)?;
            l.mlp.set_compute_type(ct)?;
        }
        self.compute = ct;
        Ok(())
    }

    /// mel [n_mels, 3000] -> conv1 + GELU, conv2 + GELU, + positions: [n_ctx, d].
    /// Both convolutions are an im2col followed by one matmul.
    pub fn stem(&self, c: &Config, mel: &[f32]) -> Vec<f32> {
        let (n_mels, d) = (c.n_mels, c.d_model);
        let t_in = mel.len() / n_mels;
        assert_eq!(
            mel.len(),
            n_mels * t_in,
            "encoder: mel is not [n_mels, frames]"
        );
        assert_eq!(
            t_in,
            2 * c.n_audio_ctx,
            "encoder: expected {} frames",
            2 * c.n_audio_ctx
        );
        // conv1 (k3, pad 1) over the mel bins, channel-major [n_mels, t_in].
        let cols = im2col_1d(mel, t_in, n_mels, 1, t_in, 3, 1, 1, t_in);
        let mut h1 = self.conv1.forward(&cols);
        cpu::gelu_fast_all(&mut h1);
        // conv2 (k3, stride 2, pad 1) over h1, time-major [t_in, d].
        let t_out = c.n_audio_ctx;
        let cols = im2col_1d(&h1, t_in, d, d, 1, 3, 2, 1, t_out);
        let mut x = self.conv2.forward(&cols);
        cpu::gelu_fast_all(&mut x);
        x.par_iter_mut()
            .zip(self.positions.par_iter())
            .for_each(|(v, p)| *v += p);
        x
    }

    /// mel [n_mels, 3000] -> encoder output [n_audio_ctx, d].
    pub fn forward(&self, c: &Config, mel: &[f32]) -> Vec<f32> {
        let mut x = self.stem(c, mel);
        for layer in &self.layers {
            layer.forward(c, &mut x, self.compute);
        }
        self.norm.forward(&x)
    }
}

/// softmax(scale q k^T) v for one head: q [m, hd], k packed from [frames,
/// hd], v^T packed from [hd, frames] -> [m, hd]. Two GEMMs: over 1500
/// audio positions the row-by-row dot products of `cpu::attention` were two
/// thirds of a CPU transcription. In int8 the softmax takes the polynomial
/// `exp` of `cpu::softmax_rows_fast` (libm's scalar one over the encoder's
/// 1500 x 1500 scores a head was then most of an encode).
fn attend(
    q: &[f32],
    k: &cpu::PackedMatrix,
    vt: &cpu::PackedMatrix,
    scale: f32,
    ct: ComputeType,
) -> Vec<f32> {
    let (frames, hd) = (k.rows(), k.cols());
    let m = q.len() / hd;
    let mut scores = vec![0.0; m * frames];
    cpu::matmul_packed(q, k, None, m, &mut scores);
    match ct {
        ComputeType::Float32 => scores.par_chunks_mut(frames).for_each(|row| {
            row.iter_mut().for_each(|v| *v *= scale);
            cpu::softmax_rows(row, frames);
        }),
        ComputeType::Int8 => {
            scores.par_iter_mut().for_each(|v| *v *= scale);
            cpu::softmax_rows_fast(&mut scores, frames);
        }
    }
    let mut o = vec![0.0; m * hd];
    cpu::matmul_packed(&scores, vt, None, m, &mut o);
    o
}

/// Head `h`'s columns of rows of `width` starting at column `col` -> [rows, hd].
fn head_columns(x: &[f32], width: usize, col: usize, hd: usize, h: usize) -> Vec<f32> {
    x.chunks_exact(width)
        .flat_map(|r| r[col + h * hd..col + (h + 1) * hd].iter().copied())
        .collect()
}

/// One head's k [frames, hd] and v^T [hd, frames], packed for [`attend`],
/// from rows [frames, width] holding k at column `k_col`, v at `v_col`.
fn pack_head_kv(
    x: &[f32],
    width: usize,
    (k_col, v_col): (usize, usize),
    hd: usize,
    h: usize,
) -> (cpu::PackedMatrix, cpu::PackedMatrix) {
    let frames = x.len() / width;
    let k = head_columns(x, width, k_col, hd, h);
    let mut vt = vec![0.0; hd * frames];
    for (r, row) in x.chunks_exact(width).enumerate() {
        for (j, &v) in row[v_col + h * hd..v_col + (h + 1) * hd].iter().enumerate() {
            vt[j * frames + r] = v;
        }
    }
    (
        cpu::PackedMatrix::pack(&k, frames, hd),
        cpu::PackedMatrix::pack(&vt, hd, frames),
    )
}

/// Writes head `h`'s output [rows, hd] into its columns of `out` [rows, d].
fn scatter_head(out: &mut [f32], o: &[f32], d: usize, hd: usize, h: usize) {
    for (dst, src) in out.chunks_exact_mut(d).zip(o.chunks_exact(hd)) {
        dst[h * hd..(h + 1) * hd].copy_from_slice(src);
    }
}

/// Non-causal self-attention over fused rows `qkv` [t, 3d] -> [t, d]: what
/// `cpu::attention` computes, through [`attend`].
fn full_attention(qkv: &[f32], t: usize, d: usize, heads: usize, ct: ComputeType) -> Vec<f32> {
    let hd = d / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0; t * d];
    for h in 0..heads {
        let (k, vt) = pack_head_kv(qkv, 3 * d, (d, 2 * d), hd, h);
        let o = attend(&head_columns(qkv, 3 * d, 0, hd, h), &k, &vt, scale, ct);
        scatter_head(&mut out, &o, d, hd, h);
    }
    out
}

impl EncoderLayer {
    fn forward(&self, c: &Config, x: &mut [f32], ct: ComputeType) {
        let d = c.d_model;
        let t = x.len() / d;
        let qkv = self.qkv.forward(&self.attn_norm.forward(x));
        let a = full_attention(&qkv, t, d, c.n_audio_heads, ct);
        cpu::add_assign(x, &self.out.forward(&a));
        self.mlp.forward(x);
    }
}

/// The cross-attention keys and values of one audio window, per decoder
/// layer [n_audio_ctx, 2d]: k in columns 0..d, v in d..2d.
#[derive(Clone)]
pub struct CrossKv {
    pub kv: Vec<Vec<f32>>,
    /// Per layer, per head: k and v^T packed for the CPU decoder's
    /// cross-attention ([`attend`]), made on its first step.
    packed: OnceLock<Vec<Vec<(cpu::PackedMatrix, cpu::PackedMatrix)>>>,
}

impl CrossKv {
    pub fn new(kv: Vec<Vec<f32>>) -> CrossKv {
        CrossKv {
            kv,
            packed: OnceLock::new(),
        }
    }

    fn packed(&self, d: usize, heads: usize) -> &[Vec<(cpu::PackedMatrix, cpu::PackedMatrix)>] {
        self.packed.get_or_init(|| {
            let hd = d / heads;
            self.kv
                .iter()
                .map(|kv| {
                    (0..heads)
                        .map(|h| pack_head_kv(kv, 2 * d, (0, d), hd, h))
                        .collect()
                })
                .collect()
        })
    }
}

/// The cross-attention scores of one decoder head, filled by
/// `Decoder::forward_capturing`.
#[derive(Clone, Debug)]
pub struct CrossScores {
    pub layer: usize,
    pub head: usize,
    /// [rows, n_audio_ctx]
    pub scores: Vec<f32>,
}

/// q . k / sqrt(head_dim) of one head: q [rows, d], kv [frames, 2d] (k in
/// columns 0..d) -> [rows, frames].
fn cross_scores(q: &[f32], kv: &[f32], d: usize, heads: usize, head: usize) -> Vec<f32> {
    let hd = d / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let cols = head * hd..(head + 1) * hd;
    let frames = kv.len() / (2 * d);
    let mut out = vec![0.0; q.len() / d * frames];
    out.par_chunks_mut(frames.max(1))
        .zip(q.par_chunks(d))
        .for_each(|(row, qr)| {
            let qh = &qr[cols.clone()];
            for (f, o) in row.iter_mut().enumerate() {
                let k = &kv[f * 2 * d + cols.start..f * 2 * d + cols.end];
                *o = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
        });
    out
}

/// One sequence's self-attention cache, per layer [len, 2d] (k then v).
#[derive(Clone)]
pub struct KvCache {
    kv: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Decoder {
    pub fn new_cache(&self) -> KvCache {
        KvCache {
            kv: vec![Vec::new(); self.layers.len()],
            len: 0,
        }
    }

    /// The cross-attention keys and values for encoder output `xa` [n_audio_ctx, d].
    pub fn cross_kv(&self, xa: &[f32]) -> CrossKv {
        CrossKv::new(self.layers.iter().map(|l| l.cross_kv.forward(xa)).collect())
    }

    /// Runs `n_new` new tokens for each of `caches.len()` sequences
    /// (`tokens` holds them sequence after sequence), appending to the caches.
    /// Returns the final-norm hidden states [n_seq * n_new, d].
    pub fn forward(
        &self,
        c: &Config,
        tokens: &[u32],
        caches: &mut [KvCache],
        cross: &CrossKv,
    ) -> Vec<f32> {
        self.forward_capturing(c, tokens, caches, cross, &mut [])
    }

    /// `forward`, also filling each of `heads` with the cross-attention
    /// scores (q . k / sqrt(head_dim), before the softmax) of its (layer,
    /// head) [n_seq * n_new, n_audio_ctx]: what word alignment reads.
    pub fn forward_capturing(
        &self,
        c: &Config,
        tokens: &[u32],
        caches: &mut [KvCache],
        cross: &CrossKv,
        heads: &mut [CrossScores],
    ) -> Vec<f32> {
        let d = c.d_model;
        let n_seq = caches.len();
        let n_new = tokens.len() / n_seq.max(1);
        assert!(
            n_seq > 0 && tokens.len() == n_seq * n_new,
            "decoder: tokens per sequence"
        );
        let past = caches[0].len;
        assert!(
            caches.iter().all(|k| k.len == past),
            "decoder: caches of different lengths"
        );
        assert!(
            past + n_new <= c.n_text_ctx,
            "decoder: {} positions exceed the {} context",
            past + n_new,
            c.n_text_ctx
        );
        let mut x = vec![0.0; tokens.len() * d];
        for (r, (row, &tok)) in x.chunks_exact_mut(d).zip(tokens).enumerate() {
            let tok = tok as usize;
            assert!(
                tok < c.n_vocab,
                "decoder: token {tok} outside the vocabulary"
            );
            let pos = past + r % n_new;
            let e = &self.embedding[tok * d..(tok + 1) * d];
            let p = &self.positions[pos * d..(pos + 1) * d];
            match self.compute {
                ComputeType::Float32 => {
                    for ((o, a), b) in row.iter_mut().zip(e).zip(p) {
                        *o = a + b;
                    }
                }
                ComputeType::Int8 => {
                    // CTranslate2 looks up the head's int8 levels, scaled back.
                    let mut levels = vec![0i8; d];
                    let inv = 1.0 / gemm8::quantize_row(e, &mut levels);
                    for ((o, &l), b) in row.iter_mut().zip(&levels).zip(p) {
                        *o = l as f32 * inv + b;
                    }
                }
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            // Causal self-attention over the cache plus the new tokens.
            let qkv = layer.self_qkv.forward(&layer.self_norm.forward(&x));
            let self_shape =
                attention_shape(d, c.n_text_heads, true, (3 * d, 0), (2 * d, 0), (2 * d, d));
            let mut a = vec![0.0; x.len()];
            for (s, cache) in caches.iter_mut().enumerate() {
                let rows = s * n_new..(s + 1) * n_new;
                for row in qkv[rows.start * 3 * d..rows.end * 3 * d].chunks_exact(3 * d) {
                    cache.kv[li].extend_from_slice(&row[d..]);
                }
                let span = SeqSpan {
                    q_start: 0,
                    q_len: n_new,
                    kv_start: 0,
                    kv_len: past + n_new,
                };
                let q = &qkv[rows.start * 3 * d..rows.end * 3 * d];
                let kv = &cache.kv[li];
                cpu::attention(
                    q,
                    kv,
                    kv,
                    &[span],
                    &self_shape,
                    &mut a[rows.start * d..rows.end * d],
                );
            }
            cpu::add_assign(&mut x, &layer.self_out.forward(&a));
            // Cross-attention to the audio.
            let q = layer.cross_q.forward(&layer.cross_norm.forward(&x));
            let kv = &cross.kv[li];
            for capture in heads.iter_mut().filter(|h| h.layer == li) {
                capture.scores = cross_scores(&q, kv, d, c.n_text_heads, capture.head);
            }
            // Every row attends to the same window: one GEMM pair a head.
            let hd = d / c.n_text_heads;
            let scale = 1.0 / (hd as f32).sqrt();
            let mut a = vec![0.0; x.len()];
            for (h, (k, vt)) in cross.packed(d, c.n_text_heads)[li].iter().enumerate() {
                let o = attend(&head_columns(&q, d, 0, hd, h), k, vt, scale, self.compute);
                scatter_head(&mut a, &o, d, hd, h);
            }
            cpu::add_assign(&mut x, &layer.cross_out.forward(&a));
            layer.mlp.forward(&mut x);
        }
        for cache in caches.iter_mut() {
            cache.len += n_new;
        }
        self.norm.forward(&x)
    }

    /// Computes the layers' linears and the head in `ct` from now on.
    fn set_compute_type(&mut self, c: &Config, ct: ComputeType) -> Result<()> {
        for l in &mut self.layers {
            for lin in [
                &mut l.self_qkv,
                &mut l.self_out,
                &mut l.cross_q,
                &mut l.cross_kv,
                &mut l.cross_out,
            ] {
                lin.set_compute_type(ct)?;
            }
            l.mlp.set_compute_type(ct)?;
        }
        self.head = match ct {
            ComputeType::Float32 => OnceLock::new(),
            ComputeType::Int8 => OnceLock::from(Head::Int8(int8_rows(
                "decoder/embeddings/weight",
                &self.embedding,
                c.n_vocab,
                c.d_model,
            )?)),
        };
        self.compute = ct;
        Ok(())
    }

    /// Logits [rows, n_vocab] of final-norm hidden states [rows, d].
    pub fn logits(&self, c: &Config, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / c.d_model;
        let head = self
            .head
            .get_or_init(|| Head::new(&self.embedding, c.n_vocab, c.d_model));
        let mut y = vec![0.0; rows * c.n_vocab];
        head.forward(hidden, c.n_vocab, c.d_model, &mut y);
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_attention_matches_cpu_attention() {
        let mut rng = crate::util::rng::Rng::new(11);
        let (t, d, heads) = (37, 24, 3);
        let qkv = rng.vec(t * 3 * d, -2.0, 2.0);
        let shape = attention_shape(d, heads, false, (3 * d, 0), (3 * d, d), (3 * d, 2 * d));
        let mut want = vec![0.0; t * d];
        cpu::attention(&qkv, &qkv, &qkv, &[SeqSpan::same(0, t)], &shape, &mut want);
        // int8's polynomial exp is within a few ulps of libm's.
        for ct in [ComputeType::Float32, ComputeType::Int8] {
            let got = full_attention(&qkv, t, d, heads, ct);
            for (g, w) in got.iter().zip(&want) {
                // The same sums in another order (f32, |values| of a few units).
                assert!((g - w).abs() <= 1e-4, "{ct:?}: {g} against {w}");
            }
        }
    }

    #[test]
    fn both_heads_match_the_plain_matmul() {
        let mut rng = crate::util::rng::Rng::new(5);
        // 130 rows: two whole tiles and a partial one.
        let (m, k, n) = (3, 40, 130);
        let x = rng.vec(m * k, -1.0, 1.0);
        let exact: Vec<f32> = rng
            .vec(n * k, -1.0, 1.0)
            .iter()
            .map(|&v| f16::from_f32(v).to_f32())
            .collect();
        let mut not_f16 = exact.clone();
        not_f16[7] += 1e-6;
        for (w, half) in [(&exact, true), (&not_f16, false)] {
            let head = Head::new(w, n, k);
            assert_eq!(matches!(head, Head::Half(_)), half);
            let mut want = vec![0.0; m * n];
            cpu::matmul(&x, w, None, m, k, n, &mut want);
            let mut got = vec![f32::NAN; m * n];
            head.forward(&x, n, k, &mut got);
            for (g, w) in got.iter().zip(&want) {
                // Same products summed in another order (40 terms, f32).
                assert!((g - w).abs() <= 1e-4, "{g} against {w}");
            }
        }
    }

    /// The int8 Linear against the f32 one, within what quantising both
    /// sides can move each output, bounded from the data: |w - w'| |x|
    /// summed (w' a row's levels scaled back), plus half an input level
    /// (max |x| / 127 of its row) times |w'|.
    #[test]
    fn int8_linear_within_the_quantisation_bound() {
        let mut rng = crate::util::rng::Rng::new(17);
        let (m, k, n) = (3, 96, 37);
        let x = rng.vec(m * k, -2.0, 2.0);
        let mut lin = Linear::new(rng.vec(n * k, -0.5, 0.5), Some(rng.vec(n, -1.0, 1.0)), n, k);
        let want = lin.forward(&x);
        lin.set_compute_type(ComputeType::Int8).unwrap();
        let got = lin.forward(&x);
        let mut moved = 0;
        let mut levels = vec![0i8; k];
        for j in 0..n {
            let w = &lin.w[j * k..(j + 1) * k];
            let s = gemm8::quantize_row(w, &mut levels);
            let w8: Vec<f32> = levels.iter().map(|&l| l as f32 / s).collect();
            for i in 0..m {
                let xi = &x[i * k..(i + 1) * k];
                let half_level = xi.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 254.0;
                let bound: f32 = (0..k)
                    .map(|t| (w[t] - w8[t]).abs() * xi[t].abs() + w8[t].abs() * half_level)
                    .sum();
                let (g, e) = (got[i * n + j], want[i * n + j]);
                // 1% and 1e-5 for the f32 sums' own rounding.
                assert!(
                    (g - e).abs() <= bound * 1.01 + 1e-5,
                    "[{i},{j}] {g} vs {e}, bound {bound}"
                );
                moved += usize::from(g != e);
            }
        }
        assert!(moved > 0, "int8 gave the f32 results: not quantised");
        // float32 again: the reference's bits.
        lin.set_compute_type(ComputeType::Float32).unwrap();
        assert_eq!(lin.forward(&x), want);
    }

    #[test]
    fn im2col_matches_a_direct_convolution() {
        let mut rng = crate::util::rng::Rng::new(9);
        let (t_in, ch, out, k, stride, pad) = (11, 3, 2, 3, 2, 1);
        // Channel-major input, as the mel spectrogram.
        let x = rng.vec(ch * t_in, -1.0, 1.0);
        let w = rng.vec(out * ch * k, -1.0, 1.0);
        let t_out = (t_in + 2 * pad - k) / stride + 1;
        let cols = im2col_1d(&x, t_in, ch, 1, t_in, k, stride, pad, t_out);
        let mut y = vec![0.0; t_out * out];
        cpu::matmul(&cols, &w, None, t_out, ch * k, out, &mut y);
        for t in 0..t_out {
            for o in 0..out {
                let mut want = 0.0;
                for c in 0..ch {
                    for j in 0..k {
                        let s = (t * stride + j) as isize - pad as isize;
                        if (0..t_in as isize).contains(&s) {
                            want += w[(o * ch + c) * k + j] * x[c * t_in + s as usize];
                        }
                    }
                }
                assert!((y[t * out + o] - want).abs() < 1e-5);
            }
        }
    }
}
