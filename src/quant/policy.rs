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
//! - every other matrix gets the target type (llama-quantize `--pure`), or,
//!   with a [`Mix`] (Q4_K_M and friends), the type llama-quantize's
//!   `llama_tensor_get_type` gives it: some attention-value and FFN-down
//!   matrices and the output head at higher precision; the token embedding
//!   and the output head can be kept or given another type.

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
    /// llama-quantize's per-tensor mix, when one was asked for.
    pub mix: Option<Mix>,
}

/// llama-quantize's K-quant mixes (`LLAMA_FTYPE_MOSTLY_*`): a base type
/// with some tensors raised, as `llama_tensor_get_type_impl` in
/// llama.cpp's src/llama-quant.cpp chooses them (dense models; the MoE,
/// Falcon and 70B special cases do not apply to the architectures read here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Q2K,
    Q3KS,
    Q3KM,
    Q3KL,
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
    Q6K,
}

/// Where a tensor sits in the file, for the mixes that depend on it: its
/// index among the attention-value tensors (and their count) or its layer
/// among the FFN-down tensors (and the layer count), whether the model has
/// a separate output head, and the head's row length.
#[derive(Clone, Copy, Debug, Default)]
pub struct Position {
    pub attn_v: Option<(usize, usize)>,
    pub ffn_down: Option<(usize, usize)>,
    pub tied_embeddings: bool,
}

impl Mix {
    pub const ALL: [Mix; 9] = [
        Mix::Q2K,
        Mix::Q3KS,
        Mix::Q3KM,
        Mix::Q3KL,
        Mix::Q4KS,
        Mix::Q4KM,
        Mix::Q5KS,
        Mix::Q5KM,
        Mix::Q6K,
    ];

    /// llama-quantize's name, lower case (`q4_k_m`).
    pub fn name(self) -> &'static str {
        match self {
            Mix::Q2K => "q2_k_mix",
            Mix::Q3KS => "q3_k_s",
            Mix::Q3KM => "q3_k_m",
            Mix::Q3KL => "q3_k_l",
            Mix::Q4KS => "q4_k_s",
            Mix::Q4KM => "q4_k_m",
            Mix::Q5KS => "q5_k_s",
            Mix::Q5KM => "q5_k_m",
            Mix::Q6K => "q6_k_mix",
        }
    }

    /// A mix by llama-quantize's name, any case. `Q2_K` and `Q6_K` name
    /// block types here (pure); their mixes are spelt q2_k_mix, q6_k_mix.
    pub fn from_name(name: &str) -> Option<Mix> {
        let lower = name.to_ascii_lowercase();
        Mix::ALL.into_iter().find(|m| m.name() == lower)
    }

    /// The type of every tensor the mix does not raise.
    pub fn base(self) -> GgmlType {
        match self {
            Mix::Q2K => GgmlType::Q2_K,
            Mix::Q3KS | Mix::Q3KM | Mix::Q3KL => GgmlType::Q3_K,
            Mix::Q4KS | Mix::Q4KM => GgmlType::Q4_K,
            Mix::Q5KS | Mix::Q5KM => GgmlType::Q5_K,
            Mix::Q6K => GgmlType::Q6_K,
        }
    }

    /// llama.cpp's `general.file_type` for the mix.
    pub fn file_type(self) -> u32 {
        match self {
            Mix::Q2K => 10,
            Mix::Q3KS => 11,
            Mix::Q3KM => 12,
            Mix::Q3KL => 13,
            Mix::Q4KS => 14,
            Mix::Q4KM => 15,
            Mix::Q5KS => 16,
            Mix::Q5KM => 17,
            Mix::Q6K => 18,
        }
    }

    /// The type llama-quantize gives tensor `name` (a quantised matrix:
    /// role Matrix, Embedding or Output) before the shape fallback.
    /// `row_len` is the tensor's row length (for the output head's rule).
    pub fn choose(self, name: &str, row_len: usize, at: Position) -> GgmlType {
        use GgmlType::*;
        let base = self.base();
        // i < n/8, the last eighth, and every third layer between.
        let more_bits = |i: usize, n: usize| {
            let (i, n) = (i as i64, n as i64);
            i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
        };
        let is_output = name == "output.weight";
        let is_embedding = name == "token_embd.weight" || name == "per_layer_token_embd.weight";
        if is_output || (is_embedding && at.tied_embeddings) {
            return if !row_len.is_multiple_of(base.block_size()) {
                Q8_0
            } else {
                Q6_K
            };
        }
        if is_embedding {
            return base;
        }
        if name.contains("attn_qkv.weight")
            || name.contains("attn_kv_b.weight")
            || name.contains("attn_v.weight")
        {
            let Some((i, n)) = at.attn_v else { return base };
            // n_gqa >= 4 raises Q2_K's attn_v to Q4_K; the GQA ratio is not
            // known here, so the dense rule (Q3_K) applies.
            return match self {
                Mix::Q2K => Q3_K,
                Mix::Q3KM if i < 2 => Q5_K,
                Mix::Q3KM => Q4_K,
                Mix::Q3KL => Q5_K,
                Mix::Q4KM | Mix::Q5KM if more_bits(i, n) => Q6_K,
                Mix::Q4KS if i < 4 => Q5_K,
                _ => base,
            };
        }
        if name.contains("ffn_down") {
            let Some((i, n)) = at.ffn_down else {
                return base;
            };
            return match self {
                Mix::Q2K => Q3_K,
                Mix::Q3KM if i < n / 16 => Q5_K,
                Mix::Q3KM => Q4_K,
                Mix::Q3KL => Q5_K,
                Mix::Q4KM | Mix::Q5KM if more_bits(i, n) => Q6_K,
                Mix::Q4KS if i < n / 8 => Q5_K,
                _ => base,
            };
        }
        if name.contains("attn_output.weight") {
            return match self {
                Mix::Q2K => Q3_K,
                Mix::Q3KM => Q4_K,
                Mix::Q3KL => Q5_K,
                _ => base,
            };
        }
        base
    }
}

/// The [`Position`] of every tensor of a file, in file order, as
/// llama-quantize counts: attention-value tensors by their running index
/// among all of them, FFN-down tensors by their running index against the
/// model's layer count (the highest `blk.N.` plus one).
pub fn positions(names: &[&str]) -> Vec<Position> {
    let is_attn_v = |n: &str| {
        n.contains("attn_qkv.weight")
            || n.contains("attn_kv_b.weight")
            || n.contains("attn_v.weight")
    };
    let n_attn_v = names.iter().filter(|n| is_attn_v(n)).count();
    let n_layer = names
        .iter()
        .filter_map(|n| {
            n.strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1);
    let tied = !names.contains(&"output.weight");
    let (mut i_v, mut i_down) = (0, 0);
    names
        .iter()
        .map(|n| {
            let mut p = Position {
                tied_embeddings: tied,
                ..Position::default()
            };
            if is_attn_v(n) {
                p.attn_v = Some((i_v, n_attn_v));
                i_v += 1;
            } else if n.contains("ffn_down") {
                p.ffn_down = Some((i_down, n_layer));
                i_down += 1;
            }
            p
        })
        .collect()
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
            mix: None,
        }
    }

    /// `general.file_type` of the output.
    pub fn file_type(&self) -> u32 {
        self.mix
            .map_or_else(|| llama_file_type(self.target), Mix::file_type)
    }

    /// The type for tensor `name` of `shape`, stored as `source` in the
    /// input; `kept` is what a never-quantised tensor becomes (F32 from an
    /// HF checkpoint, as llama.cpp's converter writes it; `source` from a GGUF).
    pub fn choose(&self, name: &str, shape: &[usize], source: GgmlType, kept: GgmlType) -> Choice {
        self.choose_at(name, shape, source, kept, Position::default())
    }

    /// [`Policy::choose`] for a tensor at `at` in its file (what a [`Mix`]
    /// depends on; see [`positions`]).
    pub fn choose_at(
        &self,
        name: &str,
        shape: &[usize],
        source: GgmlType,
        kept: GgmlType,
        at: Position,
    ) -> Choice {
        let row_len = shape.last().copied().unwrap_or(1);
        let target = match self.mix {
            Some(mix) => mix.choose(name, row_len, at),
            None => self.target,
        };
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
            _ => target,
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
            mix: None,
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
