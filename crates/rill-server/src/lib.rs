//! # rill-server
//!
//! An OpenAI-compatible API over the same engine [`Handle`] the window uses, so API requests and
//! chats share the flow (they time-share the machine; nothing queues behind a long answer):
//! `POST /v1/chat/completions` and `POST /v1/completions` (streamed as SSE or whole),
//! `GET /v1/models`, `GET /health`. Errors come in OpenAI's JSON shape ([`error`]).
//!
//! Safe by default: it binds 127.0.0.1; an API key (Bearer) is optional there and required on
//! any other address, and a blank key is refused; a request that names another machine
//! (`Host`) or comes from a foreign web page (`Origin`) is served only with the key, so without
//! one only local requests are, against DNS rebinding; request bodies are limited; no CORS. A client that disconnects mid-stream
//! drops its generation, which the engine cancels at once.
//!
//! [`remote`] is the other direction: a client for OpenAI-compatible servers (vLLM, TGI, Ollama,
//! llama.cpp, another Rill) that yields the engine's own [`rill_engine::Event`]s.

pub mod api;
pub mod conn;
pub mod error;
mod guard;
pub mod log;
pub mod remote;
mod reply;
mod tools;

pub use guard::is_loopback_host;
pub use log::{LoggedRequest, RequestLog};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use rill_engine::{Handle, Prompt, SamplingParams};
use rill_store::Store;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::api::{ChatCompletionRequest, CompletionRequest};
use crate::error::ApiError;
use crate::reply::{Kind, Reply};

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
    /// Speculative decoding for requests that do not say (`rill serve --lookup` or `--draft-model`).
    pub speculation: rill_engine::Speculation,
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
            // A base64 image of up to 20 MB (`vision::picture::MAX_BYTES`) is 27 MB of JSON.
            body_limit: 32 << 20,
            defaults: api::openai_defaults(),
            speculation: rill_engine::Speculation::Off,
            store: None,
            log: None,
        }
    }
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub handle: Handle,
    pub model_id: String,
    pub api_key: Option<Arc<str>>,
    pub slots: Arc<Semaphore>,
    pub defaults: Arc<SamplingParams>,
    pub speculation: rill_engine::Speculation,
    pub store: Option<Store>,
}

/// The API's routes over an engine handle (testable in process with `oneshot`).
pub fn router(handle: Handle, config: ServerConfig) -> Router {
    let model_id = model_id(&handle);
    let state = AppState {
        handle,
        model_id,
        // A blank key is no key (issue 40): `listen` refuses one; here it leaves the server
        // keyless, with the local-only checks, rather than open to any request.
        api_key: usable_key(config.api_key.as_deref()).map(Arc::from),
        slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
        defaults: Arc::new(config.defaults),
        speculation: config.speculation,
        store: config.store,
    };
    let log = config.log;
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        // The body is read (in time) only once the key is known good.
        .route_layer(middleware::from_fn_with_state(
            config.body_limit,
            conn::body_in_time,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            guard::require_key,
        ));
    let routes = Router::new()
        .merge(v1)
        .route("/health", get(health))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::local_only,
        ))
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

/// The key, if it is one: a blank or whitespace-only key is none.
fn usable_key(key: Option<&str>) -> Option<&str> {
    key.filter(|k| !k.trim().is_empty())
}

/// Checks an API key given on the command line or in settings: a blank or whitespace-only
/// key is refused (it would be compared as the empty string, and let any request in).
pub fn check_api_key(key: Option<&str>) -> std::io::Result<()> {
    match key {
        Some(k) if usable_key(Some(k)).is_none() => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the API key is blank: give a real key, or none for a local-only server",
        )),
        _ => Ok(()),
    }
}

/// Binds the API's address (refusing a blank key, and anything beyond loopback without an API
/// key), so a caller learns of a taken port or a refused address before it reports "listening".
pub async fn listen(
    addr: SocketAddr,
    config: &ServerConfig,
) -> std::io::Result<tokio::net::TcpListener> {
    check_api_key(config.api_key.as_deref())?;
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

/// Serves on `listener` until `shutdown` completes (the app's API toggle), with the
/// connection limits of [`conn`].
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    handle: Handle,
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    conn::serve(listener, router(handle, config), shutdown).await
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

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Liveness, to anyone allowed in; plus what the engine holds (generations alive and their KV
/// cache, so operators and tests can see a dropped client's generation go away) to those with
/// the key, when the server has one.
async fn health(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Json<Value> {
    if !guard::has_key(&s, &headers) {
        return Json(json!({"status": "ok"}));
    }
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

async fn chat_completions(
    State(s): State<AppState>,
    body: Result<Json<ChatCompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(rejected)?;
    check_model(&s, req.model.as_deref())?;
    let messages = req.messages()?;
    // Pictures the model cannot take are a 400 before anything starts or is saved.
    let images: Vec<_> = messages.iter().flat_map(|m| m.images.clone()).collect();
    if !images.is_empty() {
        let handle = s.handle.clone();
        tokio::task::spawn_blocking(move || handle.check_images(&images))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
    }
    let (stream, usage) = req.sampling.streaming();
    let logprobs = req.sampling.logprobs()?;
    let tools = req.tools.check()?;
    let mut generate = req.sampling.into_generate(
        Prompt::Messages(messages.clone()),
        &s.defaults,
        s.speculation,
        logprobs,
    )?;
    let format = s.handle.tool_format();
    if let Some(g) = tools.grammar(&s.handle)? {
        if generate.grammar.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "a forced tool call cannot be combined with `response_format` or `grammar`",
            ));
        }
        generate.grammar = Some(g);
    }
    let read_calls = tools.parse().then_some(format);
    generate.chat = tools.args;
    // A thinking model's block goes to `reasoning_content` (and, with `--save`, to the saved
    // answer's reasoning).
    generate.split_reasoning = true;
    let save = s.store.clone().map(|store| (store, messages));
    let reply = Reply {
        kind: Kind::Chat,
        stream,
        include_usage: usage,
        logprobs,
        tools: read_calls,
    };
    reply::respond(s, reply, generate, save).await
}

async fn completions(
    State(s): State<AppState>,
    body: Result<Json<CompletionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(rejected)?;
    check_model(&s, req.model.as_deref())?;
    let (stream, usage) = req.sampling.streaming();
    let logprobs = req.sampling.legacy_logprobs()?;
    let generate = req.sampling.into_generate(
        Prompt::Text(req.prompt),
        &s.defaults,
        s.speculation,
        logprobs,
    )?;
    let reply = Reply {
        kind: Kind::Text,
        stream,
        include_usage: usage,
        logprobs,
        tools: None,
    };
    reply::respond(s, reply, generate, None).await
}
