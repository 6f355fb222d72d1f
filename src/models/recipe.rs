//! The decoder recipe, written once for every architecture and backend:
//!
//! ```text
//! x = embed(tokens)
//! per layer:  x += post_norm?(mixer(norm1(x)))     mixer: attention or short conv
//!             x += post_norm?(ffn(norm2(x)))       ffn: act(gate h) * up h, then down
//! logits = head(final_norm(x))
//! ```
//!
//! A backend implements [`DecoderOps`]: the CPU reference computes each
//! operation at once, the GPU records fused dispatches (decode) or GEMMs
//! (prefill). What differs between architectures (biases, q/k norms,
//! post-norms, sliding windows, RoPE bases, the activation) lives in
//! [`LlmConfig`] and the weights, and each operation honours it; the layer
//! sequence is only here.

use super::llm::{LayerKind, LlmConfig};
use crate::error::Result;

/// Which output joins the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// The mixer's output projection (attention `o`, conv `out_proj`).
    Mixer,
    /// The feed-forward's down projection.
    Ffn,
}

/// The operations the recipe is made of; the layer index names the weights.
pub trait DecoderOps {
    /// x = embed_scale * embedding(tokens).
    fn embed(&mut self) -> Result<()>;
    /// The attention block up to its output projection: norm1, q/k/v
    /// projections (+ biases), q/k norms, RoPE, the cache write and
    /// attention over the layer's window.
    fn attention(&mut self, layer: usize) -> Result<()>;
    /// LFM2's short-convolution block up to its output projection: norm1,
    /// in_proj, the gated causal convolution.
    fn short_conv(&mut self, layer: usize) -> Result<()>;
    /// The gated feed-forward up to its down projection: norm2, then
    /// act(gate h) * up h.
    fn ffn(&mut self, layer: usize) -> Result<()>;
    /// x += post_norm?(W y): the output projection of the mixer or the
    /// feed-forward, normalised first where the layer has a post-norm.
    fn residual(&mut self, layer: usize, which: Residual) -> Result<()>;
    /// Logits of the final-normed residual stream.
    fn head(&mut self) -> Result<()>;
}

/// Runs the whole decoder on `ops`.
pub fn decoder(cfg: &LlmConfig, ops: &mut impl DecoderOps) -> Result<()> {
    ops.embed()?;
    for (layer, kind) in cfg.layers.iter().enumerate() {
        match kind {
            LayerKind::Attention => ops.attention(layer)?,
            LayerKind::Conv => ops.short_conv(layer)?,
        }
        ops.residual(layer, Residual::Mixer)?;
        ops.ffn(layer)?;
        ops.residual(layer, Residual::Ffn)?;
    }
    ops.head()
}
