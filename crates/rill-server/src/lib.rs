//! # rill-server
//!
//! An OpenAI-compatible API over the same engine [`Handle`] the window uses, so API requests and
//! chats share the flow (they time-share the machine; nothing queues behind a long answer):
//! `POST /v1/chat/completions` and `POST /v1/completions` (streamed as SSE or whole),
//! `GET /v1/models`, `GET /health`. Errors come in OpenAI's JSON shape ([`error`]).
//!
//! Safe by default: it binds 127.0.0.1; an API key (Bearer) is optional there and required on
//! any other address; request bodies are limited; no CORS. A client that disconnects mid-stream
//! drops its generation, which the engine cancels at once.
//!
//! [`remote`] is the other direction: a client for OpenAI-compatible servers (vLLM, TGI, Ollama,
//! llama.cpp, another Rill) that yields the engine's own [`rill_engine::Event`]s.

pub mod api;
pub mod error;
pub mod log;
pub mod remote;

pub use log::{LoggedRequest, RequestLog};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use rill_engine::{Event, Generation, Handle, Message, Prompt, SamplingParams};
use rill_store::Store;
use serde_json::{json, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::{finish_reason, ChatCompletionRequest, CompletionRequest, Usage};
use crate::error::ApiError;

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Requests generating at once; more get 503 with `Retry-After`.
    pub max_concurrent: usize,
    /// Largest request body, in bytes; larger gets 413.
    pub body_limit: usize,
    /// Sampling settings for fields a request leaves out (OpenAI's by default).
    pub defaults: SamplingParams,
    /// When set, every chat completion is saved there as a conversation. Off by default: API
    /// traffic is never stored silently.
    pub store: Option<Store>,
    /// When set, every request is recorded there (the app shows it).
    pub log: Option<RequestLog>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            max_concurrent: 64,
            body_limit: 4 << 20,
            defaults: api::openai_defaults(),
            store: None,
            log: None,
        }
    }
}

#[derive(Clone)]
struct AppState {
    handle: Handle,
    model_id: String,
    api_key: Option<Arc<str>>,
    slots: Arc<Semaphore>,
    defaults: Arc<SamplingParams>,
    store: Option<Store>,
}

/// The API's routes over an engine handle (testable in process with `oneshot`).
pub fn router(handle: Handle, config: ServerConfig) -> Router {
    let model_id = model_id(&handle);
    let state = AppState {
        handle,
        model_id,
        api_key: config.api_key.map(Arc::from),
        slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
        defaults: Arc::new(config.defaults),
        store: config.store,
    };
    let log = config.log;
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let routes = Router::new()
        .merge(v1)
        .route("/health", get(health))
        .layer(DefaultBodyLimit::max(config.body_limit))
        .with_state(state);
    match log {
        Some(log) => routes.layer(middleware::from_fn_with_state(log, log::record)),
        None => routes,
    }
}

/// The id clients use for the loaded model: its file name without `.gguf`.
pub fn model_id(handle: &Handle) -> String {
    let info = handle.model_info();
    info.path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| info.name.clone())
}

/// Serves until the process ends. Refuses to listen beyond loopback without an API key.
pub async fn serve(handle: Handle, config: ServerConfig, addr: SocketAddr) -> std::io::Result<()> {
    let listener = listen(addr, &config).await?;
    serve_on(listener, handle, config, std::future::pending()).await
}

/// Binds the API's address (refusing anything beyond loopback without an API key), so a
/// caller learns of a taken port or a refused address before it reports "listening".
pub async fn listen(
    addr: SocketAddr,
    config: &ServerConfig,
) -> std::io::Result<tokio::net::TcpListener> {
    if !addr.ip().is_loopback() && config.api_key.is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("listening on {addr} (beyond this machine) needs an API key"),
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving the OpenAI-compatible API");
    Ok(listener)
}

/// Serves on `listener` until `shutdown` completes (the app's API toggle).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    handle: Handle,
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(handle, config))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn require_key(State(s): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &s.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(&**key) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// A body that failed to parse, in OpenAI's shape: 413 when too large, else 400 with the reason.
fn rejected(e: JsonRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::bad_request("request body too large")
        };
    }
    ApiError::bad_request(match e {
        JsonRejection::JsonSyntaxError(_) => format!("malformed JSON: {}", e.body_text()),
        _ => e.body_text(),
    })
}

fn check_model(s: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != s.model_id && m != "default" => Err(ApiError {
            code: Some("model_not_found"),
            ..ApiError::invalid(
                "model",
                format!("unknown model `{m}` (this server has `{}`)", s.model_id),
            )
        }),
        _ => Ok(()),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Liveness plus what the engine holds: generations alive and their KV cache, so operators (and
/// tests) can see a dropped client's generation go away.
async fn health(State(s): State<AppState>) -> Json<Value> {
    Json(json!({
        "status": "ok",
        "model": s.model_id,
        "live_generations": s.handle.live_ids().len(),
        "cache_bytes": s.handle.cache_bytes(),
    }))
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": s.model_id, "object": "model", "created": 0, "owned_by": "rill"}]}),
    )
}

/// Which endpoint a generation answers: they differ only in the shape of their JSON.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn choice(
        self,
        text: Option<&str>,
        finish: Option<&str>,
        chunk: bool,
        first: bool,
        logprobs: Option<Vec<Value>>,
    ) -> Value {
        let logprobs = logprobs.map_or(Value::Null, |content| json!({ "content": content }));
        match (self, chunk) {
            (Kind::Chat, true) => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    delta["content"] = json!(t);
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs})
            }
            (Kind::Chat, false) => json!({
                "index": 0, "message": {"role": "assistant", "content": text.unwrap_or("")},
                "finish_reason": finish, "logprobs": logprobs
            }),
            (Kind::Text, _) => {
                json!({"index": 0, "text": text.unwrap_or(""), "finish_reason": finish, "logprobs": null})
            }
        }
    }
}

async fn chat_completions(
    State(s): State<AppState>,
    body: Result<Json<ChatCompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(rejected)?;
    check_model(&s, req.model.as_deref())?;
    let messages = req.messages()?;
    let (stream, usage) = req.sampling.streaming();
    let logprobs = req.sampling.logprobs()?;
    let generate = req
        .sampling
        .into_generate(Prompt::Messages(messages.clone()), &s.defaults)?;
    let save = s.store.clone().map(|store| Save {
        store,
        messages,
        params: generate.params.clone(),
    });
    respond(s, Kind::Chat, generate, stream, usage, save, logprobs).await
}

async fn completions(
    State(s): State<AppState>,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(rejected)?;
    check_model(&s, req.model.as_deref())?;
    let (stream, usage) = req.sampling.streaming();
    if req.sampling.logprobs()?.is_some() {
        return Err(ApiError::invalid(
            "logprobs",
            "log-probabilities are served on /v1/chat/completions, not on the legacy /v1/completions",
        ));
    }
    let generate = req
        .sampling
        .into_generate(Prompt::Text(req.prompt), &s.defaults)?;
    respond(s, Kind::Text, generate, stream, usage, None, None).await
}

async fn respond(
    s: AppState,
    kind: Kind,
    request: rill_engine::GenerateRequest,
    stream: bool,
    include_usage: bool,
    save: Option<Save>,
    logprobs: Option<usize>,
) -> Result<Response, ApiError> {
    let permit = s
        .slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::busy())?;
    let gen = s.handle.generate(request)?;
    let id = format!(
        "{}-{}",
        if matches!(kind, Kind::Chat) {
            "chatcmpl"
        } else {
            "cmpl"
        },
        gen.control().id()
    );
    if stream {
        let reply = StreamReply {
            kind,
            id,
            model: s.model_id.clone(),
            include_usage,
            logprobs: logprobs.map(|top| (s.handle.clone(), top)),
        };
        let events = sse_stream(gen, permit, reply, save);
        return Ok(Sse::new(events).into_response());
    }
    let mut gen = gen;
    let mut text = String::new();
    let mut entries = logprobs.map(|_| Vec::new());
    while let Some(event) = gen.next_event().await {
        match event {
            Event::Token {
                text: t,
                id,
                candidates,
            } => {
                text.push_str(&t);
                if let (Some(e), Some(top)) = (entries.as_mut(), logprobs) {
                    e.push(logprob_entry(s.handle.tokenizer(), id, &candidates, top));
                }
            }
            Event::Done {
                reason,
                usage,
                timings,
            } => {
                drop(permit);
                if let Some(save) = save {
                    save.spawn(s.model_id.clone(), text.clone(), reason, usage, timings);
                }
                return Ok(Json(json!({
                    "id": id, "object": kind.object(false), "created": now(), "model": s.model_id,
                    "choices": [kind.choice(Some(&text), Some(finish_reason(reason)), false, false, entries)],
                    "usage": Usage::from(usage),
                }))
                .into_response());
            }
            Event::Error { message } => return Err(ApiError::internal(message)),
            _ => {}
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the answer ended",
    ))
}

/// The answer as server-sent events: a chunk per token, a last chunk with `finish_reason`, the
/// usage chunk if asked for, then `[DONE]`. Dropping the stream (the client left) drops the
/// generation, which cancels it.
/// What a streamed reply says besides the tokens.
struct StreamReply {
    kind: Kind,
    id: String,
    model: String,
    include_usage: bool,
    /// The tokenizer's handle and `top_logprobs`, when log-probabilities were asked for.
    logprobs: Option<(Handle, usize)>,
}

fn sse_stream(
    gen: Generation,
    permit: OwnedSemaphorePermit,
    reply: StreamReply,
    save: Option<Save>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let StreamReply {
        kind,
        id,
        model,
        include_usage,
        logprobs,
    } = reply;
    struct St {
        gen: Option<Generation>,
        _permit: OwnedSemaphorePermit,
        first: bool,
        tail: Vec<SseEvent>,
        text: String,
        tokens: usize,
        save: Option<Save>,
        model_id: String,
    }
    // A client that leaves mid-stream drops this state (and with it the generation, which
    // cancels it). What was written so far is a real answer: with --save it is kept, `stopped`.
    impl Drop for St {
        fn drop(&mut self) {
            let Some(save) = self.save.take() else { return };
            if tokio::runtime::Handle::try_current().is_err() {
                return;
            }
            let usage = rill_engine::Usage {
                prompt_tokens: self.gen.as_ref().map_or(0, Generation::prompt_tokens),
                completion_tokens: self.tokens,
            };
            save.spawn(
                self.model_id.clone(),
                std::mem::take(&mut self.text),
                rill_engine::StopReason::Cancelled,
                usage,
                rill_engine::Timings::default(),
            );
        }
    }
    let model_id = model.clone();
    let created = now();
    let chunk = move |choices: Value, usage: Option<Usage>| {
        let mut v = json!({"id": id, "object": kind.object(true), "created": created, "model": model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        SseEvent::default().data(v.to_string())
    };
    stream::unfold(
        St {
            gen: Some(gen),
            _permit: permit,
            first: true,
            tail: Vec::new(),
            text: String::new(),
            tokens: 0,
            save,
            model_id: model_id.clone(),
        },
        move |mut st| {
            let chunk = chunk.clone();
            let model_id = model_id.clone();
            let logprobs = logprobs.clone();
            async move {
                loop {
                    if !st.tail.is_empty() {
                        let ev = st.tail.remove(0);
                        return Some((Ok(ev), st));
                    }
                    let gen = st.gen.as_mut()?;
                    match gen.next_event().await {
                        Some(Event::Token {
                            text,
                            id,
                            candidates,
                        }) => {
                            if text.is_empty() && !st.first && logprobs.is_none() {
                                continue;
                            }
                            let entry = logprobs.as_ref().map(|(h, top)| {
                                vec![logprob_entry(h.tokenizer(), id, &candidates, *top)]
                            });
                            let ev = chunk(
                                json!([kind.choice(Some(&text), None, true, st.first, entry)]),
                                None,
                            );
                            st.text.push_str(&text);
                            st.tokens += 1;
                            st.first = false;
                            return Some((Ok(ev), st));
                        }
                        Some(Event::Done {
                            reason,
                            usage,
                            timings,
                        }) => {
                            st.gen = None;
                            if let Some(save) = st.save.take() {
                                let text = std::mem::take(&mut st.text);
                                save.spawn(model_id.clone(), text, reason, usage, timings);
                            }
                            st.tail.push(chunk(
                                json!([kind.choice(
                                    None,
                                    Some(finish_reason(reason)),
                                    true,
                                    st.first,
                                    None
                                )]),
                                None,
                            ));
                            if include_usage {
                                st.tail.push(chunk(json!([]), Some(usage.into())));
                            }
                            st.tail.push(SseEvent::default().data("[DONE]"));
                        }
                        Some(Event::Error { message }) => {
                            st.gen = None;
                            let err = json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}});
                            st.tail.push(SseEvent::default().data(err.to_string()));
                            st.tail.push(SseEvent::default().data("[DONE]"));
                        }
                        Some(_) => continue,
                        None => return None,
                    }
                }
            }
        },
    )
}

/// One token's entry in OpenAI's `logprobs.content`: its text, bytes and natural-log
/// probability under the model, and the `top` likeliest alternatives. The probabilities are the
/// model's own (before temperature and the other sampling settings), as OpenAI reports them.
fn logprob_entry(
    tok: &rill_engine::tokenizer::Tokenizer,
    id: u32,
    candidates: &[rill_engine::Candidate],
    top: usize,
) -> Value {
    let piece = |id: u32| {
        let bytes = tok.piece_bytes(id);
        (String::from_utf8_lossy(bytes).into_owned(), bytes.to_vec())
    };
    let logprob = |p: f32| f64::from(p.max(f32::MIN_POSITIVE)).ln();
    let (token, bytes) = piece(id);
    let own = candidates
        .iter()
        .find(|c| c.id == id)
        .map_or(0.0, |c| c.raw);
    let alternatives: Vec<Value> = candidates
        .iter()
        .take(top)
        .map(|c| {
            let (token, bytes) = piece(c.id);
            json!({"token": token, "logprob": logprob(c.raw), "bytes": bytes})
        })
        .collect();
    json!({"token": token, "logprob": logprob(own), "bytes": bytes, "top_logprobs": alternatives})
}

/// A chat completion to keep as a conversation (`ServerConfig::store`).
struct Save {
    store: Store,
    messages: Vec<Message>,
    params: SamplingParams,
}

impl Save {
    /// Writes the conversation in the background; the response does not wait for the disk.
    fn spawn(
        self,
        model: String,
        answer: String,
        reason: rill_engine::StopReason,
        usage: rill_engine::Usage,
        timings: rill_engine::Timings,
    ) {
        tokio::spawn(async move {
            if let Err(e) = self.write(model, answer, reason, usage, timings).await {
                tracing::warn!(error = %e, "could not save the API conversation");
            }
        });
    }

    async fn write(
        self,
        model: String,
        answer: String,
        reason: rill_engine::StopReason,
        usage: rill_engine::Usage,
        timings: rill_engine::Timings,
    ) -> rill_store::Result<()> {
        use rill_store::{NewConversation, NewMessage, Role as R, Status};
        let system = self
            .messages
            .iter()
            .find(|m| m.role == rill_engine::Role::System)
            .map(|m| m.content.clone());
        let settings = self.params.to_json();
        let mut messages: Vec<NewMessage> = self
            .messages
            .iter()
            .filter(|m| m.role != rill_engine::Role::System)
            .map(|m| NewMessage {
                role: if m.role == rill_engine::Role::User {
                    R::User
                } else {
                    R::Assistant
                },
                content: m.content.clone(),
                status: Status::Done,
                model: None,
                settings: None,
            })
            .collect();
        messages.push(NewMessage {
            role: R::Assistant,
            content: answer,
            status: rill_chat::status_of(reason),
            model: Some(model.clone()),
            settings: Some(settings.clone()),
        });
        let stats = rill_chat::stats_of(usage, timings);
        let conversation = NewConversation {
            model: Some(model),
            system_prompt: system,
            settings: Some(settings),
        };
        self.store
            .save_conversation(conversation, &messages, &stats)
            .await
            .map(drop)
    }
}
