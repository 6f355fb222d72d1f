//! A Hugging Face model directory: `config.json` plus safetensors weights
//! (`model.safetensors` or a sharded `model.safetensors.index.json`).
//!
//! [`HfConfig`] wraps `config.json` with typed getters whose errors name the
//! file and the key. A key may be a dotted path into nested objects
//! (`"text_config.hidden_size"`) when no top-level key has that exact name.
//! Tokenizer, chat-template and generation-config files are read elsewhere.

use super::safetensors::{Safetensors, INDEX_FILE, SINGLE_FILE};
use super::TensorSource;
use crate::error::{Error, Result};
use crate::util::fs;
use serde_json::Value;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";

/// A parsed `config.json`.
#[derive(Clone, Debug)]
pub struct HfConfig {
    path: PathBuf,
    value: Value,
}

fn check_dir(dir: &Path) -> Result<()> {
    if !fs::exists(dir) {
        return Err(Error::invalid(format!(
            "{}: no such model directory",
            dir.display()
        )));
    }
    if !fs::is_dir(dir) {
        return Err(Error::invalid(format!(
            "{}: not a directory (expected an HF model directory)",
            dir.display()
        )));
    }
    Ok(())
}

impl HfConfig {
    /// Reads `dir/config.json` (or `dir` itself when it is a file).
    pub fn open(dir: impl AsRef<Path>) -> Result<HfConfig> {
        let dir = dir.as_ref();
        let path = if fs::is_file(dir) {
            dir.to_path_buf()
        } else {
            check_dir(dir)?;
            dir.join(CONFIG_FILE)
        };
        if !fs::is_file(&path) {
            return Err(Error::invalid(format!(
                "{}: missing (an HF model directory needs {CONFIG_FILE})",
                path.display()
            )));
        }
        let text = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let value: Value = serde_json::from_slice(&text)
            .map_err(|e| Error::format(&path, format!("not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(Error::format(&path, "not a JSON object"));
        }
        Ok(HfConfig { path, value })
    }

    /// A config from an in-memory JSON value (`path` is used in errors).
    pub fn from_value(path: impl Into<PathBuf>, value: Value) -> HfConfig {
        HfConfig {
            path: path.into(),
            value,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The value at `key`: an exact top-level key, else a dotted path.
    /// JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let v = match self.value.get(key) {
            Some(v) => Some(v),
            None if key.contains('.') => {
                key.split('.').try_fold(&self.value, |v, part| v.get(part))
            }
            None => None,
        };
        v.filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> Error {
        Error::format(&self.path, format!("key '{key}' is missing"))
    }

    fn wrong(&self, key: &str, v: &Value, expected: &str) -> Error {
        let mut shown = v.to_string();
        if shown.len() > 60 {
            shown.truncate(57);
            shown.push_str("...");
        }
        Error::format(
            &self.path,
            format!("key '{key}' is {shown}, expected {expected}"),
        )
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| self.wrong(key, v, expected)),
        }
    }

    pub fn get_usize_opt(&self, key: &str) -> Result<Option<usize>> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|u| usize::try_from(u).ok())
        })
    }
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.get_usize_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn get_i64_opt(&self, key: &str) -> Result<Option<i64>> {
        self.typed(key, "an integer", Value::as_i64)
    }
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_i64_opt(key)?.ok_or_else(|| self.missing(key))
    }

    /// Any JSON number, as f32.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a number", |v| v.as_f64().map(|f| f as f32))
    }
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_f32_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn get_f64_opt(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", Value::as_f64)
    }
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.get_f64_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "true or false", Value::as_bool)
    }
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.get_bool_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", Value::as_str)
    }
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get_str_opt(key)?.ok_or_else(|| self.missing(key))
    }

    pub fn get_usize_array_opt(&self, key: &str) -> Result<Option<Vec<usize>>> {
        self.typed(key, "an array of non-negative integers", |v| {
            v.as_array()?
                .iter()
                .map(|x| x.as_u64().and_then(|u| usize::try_from(u).ok()))
                .collect()
        })
    }
    pub fn get_usize_array(&self, key: &str) -> Result<Vec<usize>> {
        self.get_usize_array_opt(key)?
            .ok_or_else(|| self.missing(key))
    }

    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.iter().map(Value::as_str).collect()
        })
    }
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_str_array_opt(key)?
            .ok_or_else(|| self.missing(key))
    }
}

/// The weights of an HF model directory.
pub fn open_checkpoint(dir: impl AsRef<Path>) -> Result<Box<dyn TensorSource>> {
    let dir = dir.as_ref();
    check_dir(dir)?;
    if !fs::is_file(&dir.join(SINGLE_FILE)) && !fs::is_file(&dir.join(INDEX_FILE)) {
        let what = if fs::exists(&dir.join("pytorch_model.bin")) {
            "only pytorch_model.bin (pickle) is here; lfm reads safetensors".to_string()
        } else {
            format!("no weights: neither {SINGLE_FILE} nor {INDEX_FILE} is here")
        };
        return Err(Error::invalid(format!("{}: {what}", dir.display())));
    }
    Ok(Box::new(Safetensors::open(dir)?))
}

/// An HF model directory: its config and its weights.
pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub config: HfConfig,
    pub weights: Box<dyn TensorSource>,
}

impl HfCheckpoint {
    pub fn open(dir: impl AsRef<Path>) -> Result<HfCheckpoint> {
        let dir = dir.as_ref();
        let config = HfConfig::open(dir)?;
        let weights = open_checkpoint(dir)?;
        Ok(HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            weights,
        })
    }
}

/// A `tokenizer.json` through the tokenizers crate, parsed as JSON first:
/// tokenizers 0.22 panics ("Helper", decoders/mod.rs) on a syntax error
/// inside the `decoder` section, a lone surrogate escape included, instead
/// of returning an error. Parsing into a `Value` decodes every string, so
/// those are caught here (skipping them, as `IgnoredAny` does, is not enough).
pub fn read_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| Error::format(path, format!("not valid JSON: {e}")))?;
    tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| Error::format(path, format!("not a tokenizers JSON file: {e}")))
}
