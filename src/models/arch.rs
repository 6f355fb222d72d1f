//! The decoder architectures we run, and how each reads its config and
//! names its weights in an HF directory and a GGUF file. Everything else
//! about an architecture is a switch in [`LlmConfig`] that the recipe
//! ([`super::recipe`]) and its backends honour.

use super::llm::{Arch, LlmConfig, Names};
use super::{gemma3, lfm2, llama, phi3, qwen};
use crate::error::{Error, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::hf::HfConfig;
use crate::formats::TensorSource;

/// `model_type`s of config.json we load.
pub const HF_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "phi3",
    "lfm2",
];
/// `general.architecture`s of GGUF files we load.
pub const GGUF_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "phi3", "lfm2"];

/// The config and weight names of an HF checkpoint.
pub fn from_hf(c: &HfConfig) -> Result<(LlmConfig, Names)> {
    let model_type = c.get_str_opt("model_type")?.unwrap_or("");
    let cfg = match model_type {
        "llama" => llama::config_from_hf(c, Arch::Llama)?,
        "mistral" => llama::config_from_hf(c, Arch::Mistral)?,
        "qwen2" => qwen::config_from_hf(c, Arch::Qwen2)?,
        "qwen3" => qwen::config_from_hf(c, Arch::Qwen3)?,
        "gemma3_text" => gemma3::config_from_hf(c)?,
        "phi3" => phi3::config_from_hf(c)?,
        "lfm2" => lfm2::config_from_hf(c)?,
        other => {
            let other = if other.is_empty() { "(none)" } else { other };
            return Err(Error::unsupported(
                c.path(),
                format!(
                    "model_type '{other}' (supported: {})",
                    HF_MODEL_TYPES.join(", ")
                ),
            ));
        }
    };
    let tied = match cfg.arch {
        Arch::Lfm2 => lfm2::hf_tied(c)?,
        // transformers' defaults: Gemma ties, the others do not.
        arch => c
            .get_bool_opt("tie_word_embeddings")?
            .unwrap_or(arch == Arch::Gemma3),
    };
    let names = hf_names(&cfg, tied);
    Ok((cfg, names))
}

/// Where transformers keeps each weight of `cfg`'s architecture (`tied`:
/// the head is the embedding).
pub fn hf_names(cfg: &LlmConfig, tied: bool) -> Names {
    match cfg.arch {
        Arch::Llama | Arch::Mistral | Arch::Qwen2 | Arch::Qwen3 => llama::hf_names(cfg, tied),
        Arch::Gemma3 => gemma3::hf_names(),
        Arch::Phi3 => phi3::hf_names(tied),
        Arch::Lfm2 => lfm2::hf_names(tied),
    }
}

/// Where llama.cpp keeps each weight of `cfg`'s architecture.
pub fn gguf_names(cfg: &LlmConfig) -> Names {
    match cfg.arch {
        Arch::Lfm2 => lfm2::gguf_names(),
        _ => llama::gguf_names(cfg),
    }
}

/// The config and weight names of a GGUF file.
pub fn from_gguf(g: &GgufFile) -> Result<(LlmConfig, Names)> {
    let cfg = match g.architecture()? {
        "llama" => llama::config_from_gguf(g)?,
        "qwen2" => qwen::config_from_gguf(g, Arch::Qwen2)?,
        "qwen3" => qwen::config_from_gguf(g, Arch::Qwen3)?,
        "gemma3" => gemma3::config_from_gguf(g)?,
        "phi3" => phi3::config_from_gguf(g)?,
        "lfm2" => lfm2::config_from_gguf(g)?,
        other => {
            return Err(Error::unsupported(
                g.path(),
                format!(
                    "architecture '{other}' (supported: {})",
                    GGUF_ARCHITECTURES.join(", ")
                ),
            ))
        }
    };
    let names = gguf_names(&cfg);
    Ok((cfg, names))
}
