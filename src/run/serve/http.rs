//! The routes: OpenAI's completions, chat completions and embeddings,
//! `/v1/models`, `/health`, `/metrics`; bearer-key auth, body limits, a
//! bounded queue, and errors as OpenAI's error object.

use super::api::{self, bad, BadRequest, ChatRequest, CompletionRequest, ErrorBody, Prompt};
use super::metrics::Metrics;
use super::scheduler::{Command, GenEvent, GenRequest, Usage};
use super::{LlmService, Worker};
use crate::grammar::{json_schema, Grammar};
use crate::run::chat::Message;
use crate::run::embed::{EmbedOptions, Embedder};
use crate::run::generate::Logprob;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::stream::{self, Stream};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// Everything a request handler may use.
pub struct AppState {
    pub llm: Option<LlmService>,
    pub embed: Option<(String, Worker<Embedder>)>,
    pub audio: super::audio::AudioServices,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    /// Generation requests that may wait for admission; more get 429.
    pub max_queue: usize,
    /// Largest request body, in bytes; more gets 413.
    pub max_body: usize,
    pub next_id: AtomicU64,
}

/// An error answer: status and OpenAI's error object.
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    fn not_loaded(what: &str, flag: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no {what} is loaded (start serve with {flag})"),
        )
    }
}

impl From<BadRequest> for ApiError {
    fn from(b: BadRequest) -> ApiError {
        ApiError {
            param: b.param,
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", b.message)
        }
    }
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> ApiError {
        match e {
            crate::Error::Invalid(m) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", m)
            }
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": ErrorBody {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: None,
        }});
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

type ApiResult<T> = std::result::Result<T, ApiError>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route(
            "/v1/audio/transcriptions",
            post(super::audio::transcriptions),
        )
        .route("/v1/audio/speech", post(super::audio::speech))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Auth and accounting around every route.
async fn guard(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let endpoint = match path.as_str() {
        "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/embeddings"
        | "/v1/audio/transcriptions"
        | "/v1/audio/speech"
        | "/v1/models"
        | "/health"
        | "/metrics" => path.clone(),
        _ => "other".to_string(),
    };
    let response = match &s.api_key {
        Some(key) if path != "/health" && !authorized(req.headers(), key) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or wrong API key (send Authorization: Bearer KEY)",
        )
        .into_response(),
        _ => next.run(req).await,
    };
    s.metrics
        .count_request(&endpoint, response.status().as_u16());
    response
}

fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    constant_time_eq(given.trim().as_bytes(), key.as_bytes())
}

/// Compares without an early exit, so the time taken does not tell how
/// much of a guessed key was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such endpoint",
    )
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

async fn models(State(s): State<Arc<AppState>>) -> Response {
    let mut data = Vec::new();
    let created = unix_now();
    let names = [
        s.llm.as_ref().map(|l| l.id.clone()),
        s.embed.as_ref().map(|(id, _)| id.clone()),
        s.audio.asr.as_ref().map(|(id, _)| id.clone()),
        s.audio.voice.as_ref().map(|(id, _)| id.clone()),
    ];
    for id in names.into_iter().flatten() {
        data.push(json!({"id": id, "object": "model", "created": created, "owned_by": "lfm"}));
    }
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Reads the body as JSON, refusing more than the limit with 413.
async fn read_value(s: &AppState, body: Body) -> ApiResult<Value> {
    let bytes = axum::body::to_bytes(body, s.max_body).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than {} bytes", s.max_body),
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// Reads the body as `T`, naming the field that is wrong.
pub async fn read_json<T: DeserializeOwned>(s: &AppState, body: Body) -> ApiResult<T> {
    from_value(&read_value(s, body).await?)
}

/// A completion request and its sampling fields, read from one body.
async fn read_with_sampling<T: DeserializeOwned>(
    s: &AppState,
    body: Body,
) -> ApiResult<(T, api::Sampling)> {
    let v = read_value(s, body).await?;
    Ok((from_value(&v)?, from_value(&v)?))
}

fn from_value<T: DeserializeOwned>(v: &Value) -> ApiResult<T> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let message = match &param {
            Some(p) => format!("{p}: {}", e.inner()),
            None => e.inner().to_string(),
        };
        BadRequest { message, param }.into()
    })
}

fn llm(s: &AppState) -> ApiResult<&LlmService> {
    s.llm
        .as_ref()
        .ok_or_else(|| ApiError::not_loaded("language model", "--model"))
}

/// A generation request ready for the queue, and what the answer needs.
struct Prepared {
    req: GenRequest,
    rx: UnboundedReceiver<GenEvent>,
    stream: bool,
    include_usage: bool,
    /// Whether choices carry `token_ids`.
    token_ids: bool,
    id: String,
}

fn prepare(
    s: &AppState,
    prompt: Vec<u32>,
    sampling: &api::Sampling,
    logprobs: Option<usize>,
    prefix: &str,
) -> ApiResult<Prepared> {
    let l = llm(s)?;
    if prompt.is_empty() {
        return Err(bad("prompt", "the prompt is empty").into());
    }
    let room = l.context.saturating_sub(prompt.len());
    if room == 0 {
        return Err(bad(
            "messages",
            format!(
                "the prompt is {} tokens, which leaves no room in the model's context of {}",
                prompt.len(),
                l.context
            ),
        )
        .into());
    }
    let max_tokens = match sampling.max_tokens()? {
        Some(n) if n > room => {
            return Err(bad(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) plus max_tokens ({n}) exceeds the model's context of {} tokens (at most {room} fit)",
                    prompt.len(),
                    l.context
                ),
            )
            .into())
        }
        Some(n) => n,
        None => room,
    };
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let options = sampling.options(&l.defaults, logprobs, l.vocab, clock ^ n)?;
    let grammar = match &sampling.response_format {
        None => None,
        Some(f) => response_grammar(f)?,
    };
    if grammar.is_some() && l.tokenizer.is_none() {
        return Err(bad(
            "response_format",
            "the model has no tokenizer, which constrained output needs",
        )
        .into());
    }
    if grammar.is_some() && sampling.ignore_eos() {
        // A grammar's output ends with the end-of-sequence token.
        return Err(bad(
            "ignore_eos",
            "ignore_eos cannot be combined with a constrained response_format",
        )
        .into());
    }
    let (events, rx) = unbounded_channel();
    Ok(Prepared {
        req: GenRequest {
            prompt,
            max_tokens,
            sampling: options,
            grammar,
            stop: sampling.stop_strings()?,
            ignore_eos: sampling.ignore_eos(),
            events,
            arrived: Instant::now(),
        },
        rx,
        stream: sampling.stream(),
        include_usage: sampling.include_usage(),
        token_ids: sampling.return_token_ids.unwrap_or(false) || l.tokenizer.is_none(),
        id: format!("{prefix}-{n:x}{:x}", clock & 0xffff_ffff),
    })
}

fn response_grammar(f: &api::ResponseFormat) -> ApiResult<Option<Grammar>> {
    let schema = match f.kind.as_str() {
        "text" => return Ok(None),
        "json_object" => json!({"type": "object"}),
        "json_schema" => match &f.json_schema {
            Some(s) => s.schema.clone(),
            None => {
                return Err(bad(
                    "response_format.json_schema",
                    "type json_schema needs a json_schema object with a schema",
                )
                .into())
            }
        },
        other => {
            return Err(bad(
                "response_format.type",
                format!("unknown response format {other:?} (text, json_object or json_schema)"),
            )
            .into())
        }
    };
    let what = "response_format.json_schema.schema";
    let gbnf = json_schema::to_gbnf(&schema, what).map_err(|e| bad(what, e.to_string()))?;
    Grammar::parse(&gbnf, what)
        .map(Some)
        .map_err(|e| bad(what, e.to_string()).into())
}

/// Queues a generation, refusing with 429 when the queue is full.
fn submit(s: &AppState, req: GenRequest) -> ApiResult<()> {
    let l = llm(s)?;
    let waiting = s.metrics.waiting.fetch_add(1, Ordering::Relaxed);
    if waiting >= s.max_queue {
        s.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server is busy ({waiting} requests are waiting); retry later"),
            )
        });
    }
    l.commands
        .send(Command::Generate(Box::new(req)))
        .map_err(|_| {
            s.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down",
            )
        })
}

/// The whole answer of a non-streamed request.
struct Collected {
    text: String,
    logprobs: Vec<Logprob>,
    tokens: Vec<u32>,
    usage: Usage,
}

async fn collect(mut rx: UnboundedReceiver<GenEvent>) -> ApiResult<Collected> {
    let (mut text, mut logprobs, mut tokens) = (String::new(), Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Text {
                text: t,
                logprob,
                token,
            } => {
                text.push_str(&t);
                logprobs.extend(logprob);
                tokens.extend(token);
            }
            GenEvent::Done(usage) => {
                return Ok(Collected {
                    text,
                    logprobs,
                    tokens,
                    usage,
                })
            }
            GenEvent::Failed(m) => return Err(ApiError::internal(m)),
        }
    }
    Err(ApiError::internal(
        "the model thread stopped before the answer was complete",
    ))
}

async fn chat(State(s): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let (mut r, sampling): (ChatRequest, _) = read_with_sampling(&s, body).await?;
    r.sampling = sampling;
    let l = llm(&s)?;
    let (Some(tok), Some(template)) = (&l.tokenizer, &l.template) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the model has no chat template; use /v1/completions",
        ));
    };
    if r.messages.is_empty() {
        return Err(bad("messages", "messages is empty").into());
    }
    let mut messages = Vec::with_capacity(r.messages.len());
    for (i, m) in r.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            "system" | "user" | "assistant" | "tool" => m.role.as_str(),
            other => {
                return Err(bad(
                    &format!("messages[{i}].role"),
                    format!("unknown role {other:?} (system, user, assistant, tool)"),
                )
                .into())
            }
        };
        messages.push(Message::new(role, &api::message_text(m, i)?));
    }
    let text = template
        .render(&messages, true)
        .map_err(|e| bad("messages", format!("the chat template failed: {e}")))?;
    let prompt = tok.encode(&text, false)?;
    let p = prepare(&s, prompt, &r.sampling, r.logprobs()?, "chatcmpl")?;
    let model = r.model.clone().unwrap_or_else(|| l.id.clone());
    let want_logprobs = r.logprobs.unwrap_or(false);
    answer(&s, p, model, want_logprobs, Kind::Chat).await
}

async fn completions(State(s): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let (mut r, sampling): (CompletionRequest, _) = read_with_sampling(&s, body).await?;
    r.sampling = sampling;
    let l = llm(&s)?;
    let empty = match &r.prompt {
        Prompt::Text(t) => t.is_empty(),
        Prompt::Texts(v) => v.iter().any(String::is_empty),
        Prompt::Tokens(ids) => ids.is_empty(),
    };
    if empty {
        return Err(bad("prompt", "the prompt is empty").into());
    }
    let prompt = match &r.prompt {
        Prompt::Tokens(ids) => {
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= l.vocab) {
                return Err(bad(
                    "prompt",
                    format!(
                        "token id {t} is outside the vocabulary ({} tokens)",
                        l.vocab
                    ),
                )
                .into());
            }
            ids.clone()
        }
        Prompt::Text(t) => encode_prompt(l, t)?,
        Prompt::Texts(v) if v.len() == 1 => encode_prompt(l, &v[0])?,
        Prompt::Texts(_) => {
            return Err(bad("prompt", "one prompt per request (send several requests)").into())
        }
    };
    let logprobs = r.logprobs()?;
    let p = prepare(&s, prompt, &r.sampling, logprobs, "cmpl")?;
    let model = r.model.clone().unwrap_or_else(|| l.id.clone());
    answer(&s, p, model, logprobs.is_some(), Kind::Text).await
}

fn encode_prompt(l: &LlmService, text: &str) -> ApiResult<Vec<u32>> {
    let Some(tok) = &l.tokenizer else {
        return Err(bad("prompt", "the model has no tokenizer; send token ids").into());
    };
    Ok(tok.encode(text, true)?)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

async fn answer(
    s: &AppState,
    p: Prepared,
    model: String,
    want_logprobs: bool,
    kind: Kind,
) -> ApiResult<Response> {
    let Prepared {
        req,
        rx,
        stream,
        include_usage,
        token_ids,
        id,
    } = p;
    submit(s, req)?;
    let created = unix_now();
    if stream {
        let sse = Sse::new(event_stream(
            rx,
            id,
            model,
            created,
            kind,
            Extras {
                logprobs: want_logprobs,
                include_usage,
                token_ids,
            },
        ))
        .keep_alive(KeepAlive::default());
        return Ok(sse.into_response());
    }
    let c = collect(rx).await?;
    let finish = api::finish_name(c.usage.finish);
    let mut body = match kind {
        Kind::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": if want_logprobs { api::chat_logprobs(&c.logprobs) } else { Value::Null },
                "finish_reason": finish,
            }],
            "usage": api::usage_json(&c.usage),
        }),
        Kind::Text => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{
                "index": 0,
                "text": c.text,
                "logprobs": if want_logprobs { api::completion_logprobs(&c.logprobs, 0) } else { Value::Null },
                "finish_reason": finish,
            }],
            "usage": api::usage_json(&c.usage),
        }),
    };
    if token_ids {
        body["choices"][0]["token_ids"] = json!(c.tokens);
    }
    Ok(axum::Json(body).into_response())
}

/// What a streamed answer's chunks carry beyond the text.
#[derive(Clone, Copy)]
struct Extras {
    logprobs: bool,
    include_usage: bool,
    token_ids: bool,
}

/// Server-sent events in OpenAI's chunk format, ending with `[DONE]`.
fn event_stream(
    rx: UnboundedReceiver<GenEvent>,
    id: String,
    model: String,
    created: u64,
    kind: Kind,
    extras: Extras,
) -> impl Stream<Item = Result<Event, Infallible>> {
    struct St {
        rx: UnboundedReceiver<GenEvent>,
        pending: std::collections::VecDeque<Event>,
        started: bool,
        done: bool,
        offset: usize,
    }
    let chunk = move |choice: Value, usage: Option<Value>| -> Event {
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let mut v = json!({
            "id": id, "object": object, "created": created, "model": model,
            "choices": if choice.is_null() { json!([]) } else { json!([choice]) },
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        Event::default().data(v.to_string())
    };
    let st = St {
        rx,
        pending: Default::default(),
        started: false,
        done: false,
        offset: 0,
    };
    stream::unfold(st, move |mut st| {
        let chunk = chunk.clone();
        async move {
            loop {
                if let Some(e) = st.pending.pop_front() {
                    return Some((Ok(e), st));
                }
                if st.done {
                    return None;
                }
                if kind == Kind::Chat && !st.started {
                    st.started = true;
                    st.pending.push_back(chunk(
                        json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
                        None,
                    ));
                    continue;
                }
                match st.rx.recv().await {
                    Some(GenEvent::Text {
                        text,
                        logprob,
                        token,
                    }) => {
                        // A token that completes no character yet is sent
                        // only where its id or log probability goes with it.
                        if text.is_empty()
                            && logprob.is_none()
                            && !(extras.token_ids && token.is_some())
                        {
                            continue;
                        }
                        let lp = match (extras.logprobs, logprob) {
                            (true, Some(l)) => match kind {
                                Kind::Chat => api::chat_logprobs(std::slice::from_ref(&l)),
                                Kind::Text => {
                                    api::completion_logprobs(std::slice::from_ref(&l), st.offset)
                                }
                            },
                            _ => Value::Null,
                        };
                        st.offset += text.len();
                        let mut choice = match kind {
                            Kind::Chat => {
                                json!({"index": 0, "delta": {"content": text}, "logprobs": lp, "finish_reason": null})
                            }
                            Kind::Text => {
                                json!({"index": 0, "text": text, "logprobs": lp, "finish_reason": null})
                            }
                        };
                        if extras.token_ids {
                            choice["token_ids"] = json!(Vec::from_iter(token));
                        }
                        st.pending.push_back(chunk(choice, None));
                    }
                    Some(GenEvent::Done(u)) => {
                        let finish = api::finish_name(u.finish);
                        let choice = match kind {
                            Kind::Chat => {
                                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish})
                            }
                            Kind::Text => {
                                json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish})
                            }
                        };
                        st.pending.push_back(chunk(choice, None));
                        if extras.include_usage {
                            st.pending
                                .push_back(chunk(Value::Null, Some(api::usage_json(&u))));
                        }
                        st.pending.push_back(Event::default().data("[DONE]"));
                        st.done = true;
                    }
                    Some(GenEvent::Failed(m)) => {
                        let body = json!({"error": {"message": m, "type": "server_error", "param": null, "code": null}});
                        st.pending
                            .push_back(Event::default().data(body.to_string()));
                        st.done = true;
                    }
                    None => {
                        let body = json!({"error": {"message": "the model thread stopped", "type": "server_error", "param": null, "code": null}});
                        st.pending
                            .push_back(Event::default().data(body.to_string()));
                        st.done = true;
                    }
                }
            }
        }
    })
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum EmbedInput {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(serde::Deserialize)]
struct EmbeddingsRequest {
    input: EmbedInput,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// Most inputs one embeddings request may carry.
const MAX_EMBED_INPUTS: usize = 2048;

async fn embeddings(State(s): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let r: EmbeddingsRequest = read_json(&s, body).await?;
    let Some((id, worker)) = &s.embed else {
        return Err(ApiError::not_loaded("embedding model", "--embed-model"));
    };
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(bad(
                "encoding_format",
                format!("unknown encoding {other:?} (float or base64)"),
            )
            .into())
        }
    };
    enum Inputs {
        Texts(Vec<String>),
        Tokens(Vec<Vec<u32>>),
    }
    let inputs = match r.input {
        EmbedInput::One(t) => Inputs::Texts(vec![t]),
        EmbedInput::Many(v) => Inputs::Texts(v),
        EmbedInput::Tokens(t) => Inputs::Tokens(vec![t]),
        EmbedInput::TokenLists(v) => Inputs::Tokens(v),
    };
    let count = match &inputs {
        Inputs::Texts(v) => v.len(),
        Inputs::Tokens(v) => v.len(),
    };
    if count == 0 || count > MAX_EMBED_INPUTS {
        return Err(bad(
            "input",
            format!("input must hold 1 to {MAX_EMBED_INPUTS} items"),
        )
        .into());
    }
    if let Inputs::Texts(v) = &inputs {
        if let Some(i) = v.iter().position(|t| t.is_empty()) {
            return Err(bad(&format!("input[{i}]"), "an input is empty").into());
        }
    }
    if let Inputs::Tokens(v) = &inputs {
        if let Some(i) = v.iter().position(|t| t.is_empty()) {
            return Err(bad(&format!("input[{i}]"), "an input has no tokens").into());
        }
    }
    let dims = r.dimensions;
    let (vectors, dim, tokens) = worker
        .run(
            move |e: &mut Embedder| -> crate::Result<(Vec<f32>, usize, usize)> {
                let opts = EmbedOptions::default();
                let dim = e.dim(&opts);
                let seqs: Vec<Vec<u32>> = match inputs {
                    Inputs::Texts(t) => e.tokenize(&t)?.into_iter().map(|t| t.ids).collect(),
                    Inputs::Tokens(t) => t,
                };
                let tokens = seqs.iter().map(Vec::len).sum();
                let mut all = Vec::new();
                for chunk in seqs.chunks(opts.batch_size) {
                    all.extend(e.embed_tokens(chunk, &opts)?);
                }
                Ok((all, dim, tokens))
            },
        )
        .await??;
    if let Some(d) = dims {
        if d == 0 || d > dim {
            return Err(bad("dimensions", format!("dimensions must be 1 to {dim}")).into());
        }
    }
    let keep = dims.unwrap_or(dim);
    let data: Vec<Value> = vectors
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, v)| {
            let mut v = v[..keep].to_vec();
            if keep < dim {
                crate::run::embed::normalize(&mut v);
            }
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64_encode(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": r.model.unwrap_or_else(|| id.clone()),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// Standard base64 with padding (OpenAI's `encoding_format: base64`).
fn base64_encode(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        out.push(ABC[(n >> 18) as usize & 63] as char);
        out.push(ABC[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            ABC[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            ABC[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }
}
