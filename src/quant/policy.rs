//! Which type each tensor of a model gets when the model is converted to a
//! weight format, following `llama-quantize` (`src/llama-quant.cpp`):
//!
//! - only weights with at least two dimensions (as ggml counts them: outer
//!   dimensions of size 1 do not count) are quantised; norms
//!   (`*_norm.weight`), LFM2's short-convolution taps and Mamba's conv1d,
//!   MoE routers, position and token-type embeddings keep their type;
//! - a tensor whose row length is not a multiple of the target's block size
//!   falls back to a compatible type: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0,
//!   Q5_K -> Q5_1, Q6_K -> Q8_0, and (our choice: llama.cpp defines no
//!   fallback for it and stops) Q1_0 -> Q4_0; when even that does not fit, F16;
//! - unlike llama-quantize's default mixes (Q4_K_M and friends, which put
//!   some tensors at higher precision), every other matrix gets the target
//!   type (llama-quantize `--pure`); the token embedding and the output head
//!   can be kept or given another type.

use super::GgmlType;

/// What a tensor is, as far as the policy cares (llama.cpp tensor names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `token_embd.weight`.
    Embedding,
    /// `output.weight`.
    Output,
    /// Any other weight that llama.cpp quantises.
    Matrix,
    /// Never quantised: 1-D tensors, norms, conv taps, non-weights.
    Kept,
}

/// The role of the GGUF tensor `name` with `shape` (outermost first).
pub fn role(name: &str, shape: &[usize]) -> Role {
    // ggml_n_dims: trailing ggml dimensions (our leading ones) of size 1 do not count.
    let ggml_dims = shape
        .iter()
        .position(|&d| d != 1)
        .map_or(1, |i| shape.len() - i);
    const NEVER: [&str; 6] = [
        "_norm.weight",
        "shortconv.conv.weight",
        "ssm_conv1d",
        "ffn_gate_inp.weight",
        "position_embd",
        "token_types",
    ];
    if ggml_dims < 2 || !name.ends_with("weight") || NEVER.iter().any(|n| name.contains(n)) {
        return Role::Kept;
    }
    match name {
        "token_embd.weight" => Role::Embedding,
        "output.weight" => Role::Output,
        _ => Role::Matrix,
    }
}

/// The type a row of `row_len` elements gets when `target` is asked for:
/// `target` itself when the row is whole blocks, else llama.cpp's fallback.
pub fn fallback(target: GgmlType, row_len: usize) -> GgmlType {
    let fits = |t: GgmlType| row_len.is_multiple_of(t.block_size());
    if fits(target) {
        return target;
    }
    let next = match target {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q1_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if fits(next) {
        next
    } else {
        GgmlType::F16
    }
}

/// llama.cpp's `general.file_type` (`enum llama_ftype`) for a file whose
/// matrices are mostly `t`. K-quants without a mix map to the "S" variant,
/// the closest llama.cpp name.
pub fn llama_file_type(t: GgmlType) -> u32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2_K => 10,
        GgmlType::Q3_K => 11,
        GgmlType::Q4_K => 14,
        GgmlType::Q5_K => 16,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        GgmlType::Q1_0 => 40,
    }
}

/// What to do with the embedding or the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// The target type, like every other matrix.
    Target,
    /// Keep the type it has in the input.
    Keep,
    /// This type.
    Type(GgmlType),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub target: GgmlType,
    pub embedding: Special,
    pub output: Special,
}

/// The type chosen for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub dtype: GgmlType,
    /// The type that was asked for when its blocks did not fit the rows.
    pub fell_back_from: Option<GgmlType>,
}

impl Policy {
    /// Every matrix at `target`.
    pub fn pure(target: GgmlType) -> Policy {
        Policy {
            target,
            embedding: Special::Target,
            output: Special::Target,
        }
    }

    /// The type for tensor `name` of `shape`, stored as `source` in the
    /// input; `kept` is what a never-quantised tensor becomes (F32 from an
    /// HF checkpoint, as llama.cpp's converter writes it; `source` from a GGUF).
    pub fn choose(&self, name: &str, shape: &[usize], source: GgmlType, kept: GgmlType) -> Choice {
        let asked = match (role(name, shape), self.embedding, self.output) {
            (Role::Kept, _, _) => {
                return Choice {
                    dtype: kept,
                    fell_back_from: None,
                }
            }
            (Role::Embedding, Special::Keep, _) | (Role::Output, _, Special::Keep) => {
                return Choice {
                    dtype: source,
                    fell_back_from: None,
                }
            }
            (Role::Embedding, Special::Type(t), _) | (Role::Output, _, Special::Type(t)) => t,
            _ => self.target,
        };
        let dtype = fallback(asked, shape.last().copied().unwrap_or(1));
        Choice {
            dtype,
            fell_back_from: (dtype != asked).then_some(asked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    #[test]
    fn roles_follow_llama_cpp_names() {
        assert_eq!(role("token_embd.weight", &[384, 64]), Role::Embedding);
        assert_eq!(role("output.weight", &[384, 64]), Role::Output);
        assert_eq!(role("blk.0.attn_q.weight", &[64, 64]), Role::Matrix);
        assert_eq!(role("blk.0.attn_norm.weight", &[64]), Role::Kept);
        assert_eq!(role("blk.1.attn_q_norm.weight", &[16]), Role::Kept);
        assert_eq!(role("token_embd_norm.weight", &[64]), Role::Kept);
        assert_eq!(role("blk.0.shortconv.conv.weight", &[64, 3]), Role::Kept);
        assert_eq!(role("blk.0.attn_q.bias", &[64, 64]), Role::Kept);
        // ggml counts [1, 64] as one dimension.
        assert_eq!(role("x.weight", &[1, 64]), Role::Kept);
        assert_eq!(role("x.weight", &[2, 1, 64]), Role::Matrix);
    }

    #[test]
    fn fallbacks_match_llama_quantize() {
        assert_eq!(fallback(Q4_K, 512), Q4_K);
        assert_eq!(fallback(Q4_K, 576), Q5_0);
        assert_eq!(fallback(Q5_K, 576), Q5_1);
        assert_eq!(fallback(Q6_K, 576), Q8_0);
        assert_eq!(fallback(Q2_K, 576), Q4_0);
        assert_eq!(fallback(Q1_0, 576), Q4_0);
        assert_eq!(fallback(Q1_0, 640), Q1_0);
        assert_eq!(fallback(Q4_0, 48), F16);
        assert_eq!(fallback(Q6_K, 100), F16);
        assert_eq!(fallback(F16, 7), F16);
    }

    #[test]
    fn choices() {
        let p = Policy {
            target: Q4_K,
            embedding: Special::Keep,
            output: Special::Type(Q6_K),
        };
        let c = |n: &str, s: &[usize]| p.choose(n, s, BF16, F32);
        assert_eq!(c("token_embd.weight", &[100, 576]).dtype, BF16);
        assert_eq!(
            c("output.weight", &[100, 576]),
            Choice {
                dtype: Q8_0,
                fell_back_from: Some(Q6_K)
            }
        );
        assert_eq!(c("blk.0.ffn_down.weight", &[576, 1536]).dtype, Q4_K);
        assert_eq!(c("blk.0.attn_norm.weight", &[576]).dtype, F32);
        assert_eq!(
            Policy::pure(Q1_0)
                .choose("blk.0.attn_q.weight", &[576, 576], F32, F32)
                .dtype,
            Q4_0
        );
    }

    #[test]
    fn file_types_are_llama_cpp_ftypes() {
        assert_eq!(llama_file_type(Q4_0), 2);
        assert_eq!(llama_file_type(Q8_0), 7);
        assert_eq!(llama_file_type(BF16), 32);
        assert_eq!(llama_file_type(Q1_0), 40);
    }
}
