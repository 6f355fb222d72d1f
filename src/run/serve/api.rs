//! OpenAI's request and response shapes for completions, and how a request
//! becomes sampling options: every field checked, a bad one named in the
//! error.

use super::scheduler::Usage;
use crate::run::generate::{FinishReason, Logprob};
use crate::sampling::SamplingOptions;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A client error: HTTP 400 with OpenAI's error object.
#[derive(Debug)]
pub struct BadRequest {
    pub message: String,
    pub param: Option<String>,
}

pub fn bad(param: &str, message: impl Into<String>) -> BadRequest {
    BadRequest {
        message: message.into(),
        param: Some(param.to_string()),
    }
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Deserialize, Debug)]
pub struct JsonSchemaFormat {
    #[serde(default)]
    pub name: Option<String>,
    pub schema: Value,
}

#[derive(Deserialize, Debug)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields chat and text completions share.
#[derive(Deserialize, Debug, Default)]
pub struct Sampling {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<u64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub logit_bias: Option<BTreeMap<String, f32>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// llama-server's and vLLM's extension: the end-of-sequence token ends
    /// nothing (it is taken as any other token), so a request runs to
    /// `max_tokens` or a stop string (what serving benchmarks ask for).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// vLLM's extension: each choice (and each streamed chunk) also carries
    /// the generated tokens' ids, `token_ids`. Always so for a model
    /// without a tokenizer, whose text is empty.
    #[serde(default)]
    pub return_token_ids: Option<bool>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u64>,
    /// Read from the same body in a second pass (a flattened struct would
    /// lose the name of a bad field).
    #[serde(skip)]
    pub sampling: Sampling,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    /// The legacy API's count of top log probabilities per token.
    #[serde(default)]
    pub logprobs: Option<u64>,
    /// Read from the same body in a second pass (a flattened struct would
    /// lose the name of a bad field).
    #[serde(skip)]
    pub sampling: Sampling,
}

/// Largest `top_logprobs` / `logprobs` OpenAI accepts.
const MAX_TOP_LOGPROBS: u64 = 20;

impl Sampling {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn ignore_eos(&self) -> bool {
        self.ignore_eos.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// The token budget asked for, if any.
    pub fn max_tokens(&self) -> Result<Option<usize>, BadRequest> {
        let (field, v) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => ("max_completion_tokens", v),
            (None, Some(v)) => ("max_tokens", v),
            (None, None) => return Ok(None),
        };
        if v == 0 {
            return Err(bad(field, format!("{field} must be at least 1")));
        }
        Ok(Some(v.min(usize::MAX as u64) as usize))
    }

    pub fn stop_strings(&self) -> Result<Vec<String>, BadRequest> {
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > 4 {
            return Err(bad("stop", "at most 4 stop sequences"));
        }
        if stop.iter().any(|s| s.is_empty()) {
            return Err(bad("stop", "a stop sequence is empty"));
        }
        Ok(stop)
    }

    /// Sampling options over the model's defaults, each field range-checked.
    pub fn options(
        &self,
        defaults: &SamplingOptions,
        logprobs: Option<usize>,
        vocab: usize,
        seed: u64,
    ) -> Result<SamplingOptions, BadRequest> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(bad("n", "only n = 1 is supported"));
            }
        }
        let finite = |name: &str, v: Option<f32>, ok: &dyn Fn(f32) -> bool, want: &str| match v {
            Some(x) if !x.is_finite() || !ok(x) => Err(bad(name, format!("{name} must be {want}"))),
            _ => Ok(v),
        };
        let temperature = finite(
            "temperature",
            self.temperature,
            &|x| (0.0..=2.0).contains(&x),
            "between 0 and 2",
        )?;
        let top_p = finite("top_p", self.top_p, &|x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
        let min_p = finite(
            "min_p",
            self.min_p,
            &|x| (0.0..=1.0).contains(&x),
            "between 0 and 1",
        )?;
        let presence = finite(
            "presence_penalty",
            self.presence_penalty,
            &|x| (-2.0..=2.0).contains(&x),
            "between -2 and 2",
        )?;
        let frequency = finite(
            "frequency_penalty",
            self.frequency_penalty,
            &|x| (-2.0..=2.0).contains(&x),
            "between -2 and 2",
        )?;
        let repeat = finite(
            "repeat_penalty",
            self.repeat_penalty,
            &|x| x > 0.0,
            "positive",
        )?;
        let mut logit_bias = Vec::new();
        for (k, &v) in self.logit_bias.iter().flatten() {
            let id: u32 = k
                .parse()
                .map_err(|_| bad("logit_bias", format!("key {k:?} is not a token id")))?;
            if id as usize >= vocab {
                return Err(bad(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary ({vocab} tokens)"),
                ));
            }
            if !(-100.0..=100.0).contains(&v) {
                return Err(bad(
                    "logit_bias",
                    format!("bias {v} of token {id} is not between -100 and 100"),
                ));
            }
            logit_bias.push((id, v));
        }
        Ok(SamplingOptions {
            temperature: temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.map_or(defaults.top_k, |k| k as usize),
            top_p: top_p.unwrap_or(defaults.top_p),
            min_p: min_p.unwrap_or(defaults.min_p),
            repeat_penalty: repeat.unwrap_or(defaults.repeat_penalty),
            presence_penalty: presence.unwrap_or(0.0),
            frequency_penalty: frequency.unwrap_or(0.0),
            repeat_last_n: defaults.repeat_last_n,
            logit_bias,
            logprobs,
            seed: self.seed.unwrap_or(seed),
        })
    }
}

impl ChatRequest {
    pub fn logprobs(&self) -> Result<Option<usize>, BadRequest> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(n)) if n > MAX_TOP_LOGPROBS => Err(bad(
                "top_logprobs",
                format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
            )),
            (false, Some(_)) => Err(bad("top_logprobs", "top_logprobs needs logprobs: true")),
            (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
            (false, None) => Ok(None),
        }
    }
}

impl CompletionRequest {
    pub fn logprobs(&self) -> Result<Option<usize>, BadRequest> {
        match self.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(bad(
                "logprobs",
                format!("logprobs must be at most {MAX_TOP_LOGPROBS}"),
            )),
            n => Ok(n.map(|n| n as usize)),
        }
    }
}

/// The message's text: a string, or its text parts joined.
pub fn message_text(m: &ChatMessage, index: usize) -> Result<String, BadRequest> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for p in parts {
                if p.kind != "text" {
                    return Err(bad(
                        &format!("messages[{index}].content"),
                        format!(
                            "content parts of type {:?} are not supported (text only)",
                            p.kind
                        ),
                    ));
                }
                out.push_str(p.text.as_deref().unwrap_or(""));
            }
            Ok(out)
        }
    }
}

pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Chat logprobs entries (`choices[].logprobs.content`).
pub fn chat_logprobs(lp: &[Logprob]) -> Value {
    json!({ "content": lp.iter().map(|l| json!({
        "token": l.token.token,
        "logprob": l.token.logprob,
        "bytes": l.token.bytes,
        "top_logprobs": l.top_logprobs.iter().map(|t| json!({
            "token": t.token, "logprob": t.logprob, "bytes": t.bytes,
        })).collect::<Vec<_>>(),
    })).collect::<Vec<_>>() })
}

/// The legacy completions' logprobs object.
pub fn completion_logprobs(lp: &[Logprob], text_offset0: usize) -> Value {
    let mut offset = text_offset0;
    let mut offsets = Vec::new();
    for l in lp {
        offsets.push(offset);
        offset += l.token.token.len();
    }
    json!({
        "tokens": lp.iter().map(|l| l.token.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lp.iter().map(|l| l.token.logprob).collect::<Vec<_>>(),
        "top_logprobs": lp.iter().map(|l| l.top_logprobs.iter()
            .map(|t| (t.token.clone(), json!(t.logprob)))
            .collect::<serde_json::Map<String, Value>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// OpenAI's error object.
#[derive(Serialize)]
pub struct ErrorBody<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub param: Option<&'a str>,
    pub code: Option<&'a str>,
}
