//! The Whisper network: config -> weights -> CPU forward.
//!
//! Encoder: conv1 (k3, pad 1) + GELU, conv2 (k3, stride 2, pad 1) + GELU,
//! + sinusoidal positions, pre-norm transformer layers, final LayerNorm.
//! Decoder: token + learned positions, pre-norm layers of causal
//! self-attention (KV-cached), cross-attention to the encoder output and an
//! MLP; final LayerNorm; logits against the token embedding (shared output
//! embedding). LayerNorm eps 1e-5, exact GELU, as in openai-whisper.
//!
//! Weights are read from a CTranslate2 `model.bin` (names verbatim) and
//! widened to f32: CT2 fuses q/k/v (`self_attention/linear_0`) and the
//! cross-attention k/v (`attention/linear_1`), with a zero bias for k.

use crate::cpu;
use crate::error::{Error, Result};
use crate::formats::ct2::Ct2File;
use rayon::prelude::*;

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
            && d % c.n_audio_heads == 0
            && d % c.n_text_heads == 0
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

/// y = x W^T + b, W in the PyTorch `[out, in]` layout.
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub n_out: usize,
    pub n_in: usize,
}

impl Linear {
    fn load(f: &Ct2File, prefix: &str, n_out: usize, n_in: usize) -> Result<Linear> {
        let w = f.f32(&format!("{prefix}/weight"), &[n_out, n_in])?;
        let bias = format!("{prefix}/bias");
        let b = match f.variable(&bias) {
            Some(_) => Some(f.f32(&bias, &[n_out])?),
            None => None,
        };
        Ok(Linear { w, b, n_out, n_in })
    }

    /// x: [rows, n_in] -> [rows, n_out]
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let rows = x.len() / self.n_in;
        let mut y = vec![0.0; rows * self.n_out];
        cpu::matmul(
            x,
            &self.w,
            self.b.as_deref(),
            rows,
            self.n_in,
            self.n_out,
            &mut y,
        );
        y
    }
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
        h.par_iter_mut().for_each(|v| *v = cpu::gelu(*v));
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
    /// [d, n_mels, 3]
    pub conv1_w: Vec<f32>,
    pub conv1_b: Vec<f32>,
    /// [d, d, 3]
    pub conv2_w: Vec<f32>,
    pub conv2_b: Vec<f32>,
    /// [n_audio_ctx, d]
    pub positions: Vec<f32>,
    pub layers: Vec<EncoderLayer>,
    pub norm: LayerNorm,
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
            conv1_w: f.f32("encoder/conv1/weight", &[d, c.n_mels, 3])?,
            conv1_b: f.f32("encoder/conv1/bias", &[d])?,
            conv2_w: f.f32("encoder/conv2/weight", &[d, d, 3])?,
            conv2_b: f.f32("encoder/conv2/bias", &[d])?,
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
}

/// Multi-head attention for query rows `q` [tq, d] against keys/values
/// [tk, d] (head h in columns h*dh..(h+1)*dh), softmax(q k^T / sqrt(dh)) v.
/// With `causal = Some(past)`, query i sees keys 0..=past+i.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d: usize,
    n_heads: usize,
    causal: Option<usize>,
) -> Vec<f32> {
    let (tq, tk) = (q.len() / d, k.len() / d);
    assert!(
        q.len() == tq * d && k.len() == tk * d && v.len() == k.len(),
        "attention: shapes"
    );
    let dh = d / n_heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut out = vec![0.0; tq * d];
    out.par_chunks_mut(d).enumerate().for_each(|(i, out_row)| {
        let n_keys = causal.map_or(tk, |past| (past + i + 1).min(tk));
        let mut scores = vec![0.0f32; n_keys];
        for h in 0..n_heads {
            let qh = &q[i * d + h * dh..i * d + (h + 1) * dh];
            for (j, s) in scores.iter_mut().enumerate() {
                *s = cpu::dot(qh, &k[j * d + h * dh..j * d + (h + 1) * dh]) * scale;
            }
            cpu::softmax_rows(&mut scores, n_keys);
            let oh = &mut out_row[h * dh..(h + 1) * dh];
            for (j, &p) in scores.iter().enumerate() {
                let vj = &v[j * d + h * dh..j * d + (h + 1) * dh];
                for (o, x) in oh.iter_mut().zip(vj) {
                    *o += p * x;
                }
            }
        }
    });
    out
}

/// Splits fused rows [t, n * d] into n contiguous [t, d] blocks.
fn split_columns(x: &[f32], d: usize, n: usize) -> Vec<Vec<f32>> {
    let t = x.len() / (n * d);
    (0..n)
        .map(|part| {
            let mut y = Vec::with_capacity(t * d);
            for row in x.chunks_exact(n * d) {
                y.extend_from_slice(&row[part * d..(part + 1) * d]);
            }
            y
        })
        .collect()
}

impl Encoder {
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
        // conv1: cols[t, i*3 + k] = mel[i, t + k - 1]
        let mut cols = vec![0.0; t_in * n_mels * 3];
        cols.par_chunks_mut(n_mels * 3)
            .enumerate()
            .for_each(|(t, row)| {
                for i in 0..n_mels {
                    for k in 0..3 {
                        let s = t as isize + k as isize - 1;
                        if (0..t_in as isize).contains(&s) {
                            row[i * 3 + k] = mel[i * t_in + s as usize];
                        }
                    }
                }
            });
        let mut h1 = vec![0.0; t_in * d];
        cpu::matmul(
            &cols,
            &self.conv1_w,
            Some(&self.conv1_b),
            t_in,
            n_mels * 3,
            d,
            &mut h1,
        );
        h1.par_iter_mut().for_each(|v| *v = cpu::gelu(*v));
        // conv2, stride 2: cols[t, i*3 + k] = h1[2t + k - 1, i]
        let t_out = c.n_audio_ctx;
        let mut cols = vec![0.0; t_out * d * 3];
        cols.par_chunks_mut(d * 3).enumerate().for_each(|(t, row)| {
            for k in 0..3 {
                let s = 2 * t as isize + k as isize - 1;
                if (0..t_in as isize).contains(&s) {
                    let src = &h1[s as usize * d..(s as usize + 1) * d];
                    for i in 0..d {
                        row[i * 3 + k] = src[i];
                    }
                }
            }
        });
        let mut x = vec![0.0; t_out * d];
        cpu::matmul(
            &cols,
            &self.conv2_w,
            Some(&self.conv2_b),
            t_out,
            d * 3,
            d,
            &mut x,
        );
        x.par_iter_mut()
            .zip(self.positions.par_iter())
            .for_each(|(v, p)| *v = cpu::gelu(*v) + p);
        x
    }

    /// mel [n_mels, 3000] -> encoder output [n_audio_ctx, d].
    pub fn forward(&self, c: &Config, mel: &[f32]) -> Vec<f32> {
        let mut x = self.stem(c, mel);
        for layer in &self.layers {
            layer.forward(c, &mut x);
        }
        self.norm.forward(&x)
    }
}

impl EncoderLayer {
    fn forward(&self, c: &Config, x: &mut [f32]) {
        let d = c.d_model;
        let qkv = self.qkv.forward(&self.attn_norm.forward(x));
        let parts = split_columns(&qkv, d, 3);
        let a = attention(&parts[0], &parts[1], &parts[2], d, c.n_audio_heads, None);
        cpu::add_assign(x, &self.out.forward(&a));
        self.mlp.forward(x);
    }
}

/// The cross-attention keys and values of one audio window, per decoder
/// layer: [n_audio_ctx, d] each.
pub struct CrossKv {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

/// One sequence's self-attention cache, per layer [len, d].
#[derive(Clone)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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
            k: vec![Vec::new(); self.layers.len()],
            v: vec![Vec::new(); self.layers.len()],
            len: 0,
        }
    }

    /// The cross-attention keys and values for encoder output `xa` [n_audio_ctx, d].
    pub fn cross_kv(&self, c: &Config, xa: &[f32]) -> CrossKv {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for layer in &self.layers {
            let mut parts = split_columns(&layer.cross_kv.forward(xa), c.d_model, 2);
            v.push(parts.pop().expect("two parts"));
            k.push(parts.pop().expect("two parts"));
        }
        CrossKv { k, v }
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
            for ((o, a), b) in row.iter_mut().zip(e).zip(p) {
                *o = a + b;
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            // Causal self-attention over the cache plus the new tokens.
            let qkv = layer.self_qkv.forward(&layer.self_norm.forward(&x));
            let parts = split_columns(&qkv, d, 3);
            let mut a = vec![0.0; x.len()];
            for (s, cache) in caches.iter_mut().enumerate() {
                let rows = s * n_new * d..(s + 1) * n_new * d;
                cache.k[li].extend_from_slice(&parts[1][rows.clone()]);
                cache.v[li].extend_from_slice(&parts[2][rows.clone()]);
                let o = attention(
                    &parts[0][rows.clone()],
                    &cache.k[li],
                    &cache.v[li],
                    d,
                    c.n_text_heads,
                    Some(past),
                );
                a[rows].copy_from_slice(&o);
            }
            cpu::add_assign(&mut x, &layer.self_out.forward(&a));
            // Cross-attention to the audio.
            let q = layer.cross_q.forward(&layer.cross_norm.forward(&x));
            let a = attention(&q, &cross.k[li], &cross.v[li], d, c.n_text_heads, None);
            cpu::add_assign(&mut x, &layer.cross_out.forward(&a));
            layer.mlp.forward(&mut x);
        }
        for cache in caches.iter_mut() {
            cache.len += n_new;
        }
        self.norm.forward(&x)
    }

    /// Logits [rows, n_vocab] of final-norm hidden states [rows, d].
    pub fn logits(&self, c: &Config, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / c.d_model;
        let mut y = vec![0.0; rows * c.n_vocab];
        cpu::matmul(
            hidden,
            &self.embedding,
            None,
            rows,
            c.d_model,
            c.n_vocab,
            &mut y,
        );
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention against a plain softmax(q k^T) v written out longhand.
    #[test]
    fn attention_matches_the_definition() {
        let mut rng = crate::util::rng::Rng::new(5);
        let (d, heads, tq, tk) = (8, 2, 3, 5);
        let q = rng.vec(tq * d, -1.0, 1.0);
        let k = rng.vec(tk * d, -1.0, 1.0);
        let v = rng.vec(tk * d, -1.0, 1.0);
        for causal in [None, Some(2)] {
            let got = attention(&q, &k, &v, d, heads, causal);
            let dh = d / heads;
            for i in 0..tq {
                for h in 0..heads {
                    let n = causal.map_or(tk, |p| p + i + 1);
                    let s: Vec<f64> = (0..n)
                        .map(|j| {
                            (0..dh)
                                .map(|e| (q[i * d + h * dh + e] * k[j * d + h * dh + e]) as f64)
                                .sum::<f64>()
                                / (dh as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for e in 0..dh {
                        let want: f64 = (0..n)
                            .map(|j| (s[j] - m).exp() / z * v[j * d + h * dh + e] as f64)
                            .sum();
                        let g = got[i * d + h * dh + e] as f64;
                        assert!(
                            (g - want).abs() < 1e-5,
                            "causal {causal:?} i {i} h {h} e {e}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn split_columns_undoes_fusing() {
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let p = split_columns(&x, 2, 3);
        assert_eq!(
            p,
            vec![
                vec![0., 1., 6., 7.],
                vec![2., 3., 8., 9.],
                vec![4., 5., 10., 11.]
            ]
        );
    }
}
