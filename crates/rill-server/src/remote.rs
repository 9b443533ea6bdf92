//! A client for remote OpenAI-compatible servers (vLLM, TGI, Ollama, llama.cpp's server,
//! another Rill), for when one machine is not enough. It streams `/v1/chat/completions` and turns
//! the server-sent chunks into the engine's own [`Event`]s, so the rest of the app (and the
//! CLI) treats a remote answer like a local one.
//!
//! A remote server is not trusted to behave (issue 40): connecting gives up after
//! [`CONNECT_TIMEOUT`], a stream that sends nothing for [`IDLE_TIMEOUT`] is broken off, and
//! what is held of it is bounded: one server-sent line at most [`MAX_LINE`] bytes, an error
//! body at most [`MAX_ERROR_BODY`].

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rill_engine::{Event, Message, SamplingParams, StopReason, Timings, Usage};
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot reach {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url} refused the API key (HTTP 401): check the key")]
    Unauthorized { url: String },
    #[error("{url} answered HTTP {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url}: {message}")]
    Protocol { url: String, message: String },
}

/// How long connecting to a remote server may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a remote stream may stay silent (a model's first token on a busy server included).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest server-sent line held while it arrives.
pub const MAX_LINE: usize = 4 << 20;
/// Most of an error body read (its message is shown; the rest is dropped).
pub const MAX_ERROR_BODY: usize = 64 << 10;

/// A remote server and the model to ask for there.
#[derive(Clone, Debug)]
pub struct RemoteClient {
    base: String,
    model: String,
    api_key: Option<String>,
    http: reqwest::Client,
}

/// What to ask the remote model.
#[derive(Clone, Debug, Default)]
pub struct RemoteRequest {
    pub messages: Vec<Message>,
    pub params: SamplingParams,
    pub stop: Vec<String>,
    pub max_tokens: Option<usize>,
    /// Structured output: the answer must be JSON this schema accepts (sent as OpenAI's
    /// `response_format`, which vLLM, Ollama and llama.cpp's server enforce).
    pub json_schema: Option<Value>,
}

impl RemoteClient {
    /// `base` is the server's address, with or without the trailing `/v1`.
    pub fn new(base: &str, model: &str, api_key: Option<String>) -> Self {
        let base = base
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_owned();
        RemoteClient {
            base,
            model: model.to_owned(),
            api_key,
            http: reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .read_timeout(IDLE_TIMEOUT)
                .build()
                .unwrap_or_default(),
        }
    }

    /// Streams one answer; `on_event` gets `Token`s, then `Done` (or the call fails).
    pub async fn generate(
        &self,
        req: &RemoteRequest,
        mut on_event: impl FnMut(Event),
    ) -> Result<(), RemoteError> {
        let url = format!("{}/v1/chat/completions", self.base);
        let p = &req.params;
        // Past reasoning stays here: OpenAI's messages have no field for it, and some servers
        // (DeepSeek's) refuse one.
        let messages: Vec<serde_json::Value> = req
            .messages
            .iter()
            .map(|m| {
                let mut v = json!(Message {
                    reasoning: None,
                    ..m.clone()
                });
                // Images go as OpenAI's content parts, each a data: URL, before the text.
                if !m.images.is_empty() {
                    let mut parts: Vec<serde_json::Value> = m
                        .images
                        .iter()
                        .map(|im| json!({"type": "image_url", "image_url": {"url": im.to_url()}}))
                        .collect();
                    parts.push(json!({"type": "text", "text": m.content}));
                    v["content"] = json!(parts);
                }
                v
            })
            .collect();
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
            "temperature": p.temperature,
            "top_p": p.top_p,
            "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty,
        });
        // Fields beyond OpenAI's own are sent only when they change something: strict servers
        // reject unknown ones.
        if let Some(k) = p.top_k {
            body["top_k"] = json!(k);
        }
        if p.min_p > 0.0 {
            body["min_p"] = json!(p.min_p);
        }
        if p.repeat_penalty != 1.0 {
            body["repetition_penalty"] = json!(p.repeat_penalty);
        }
        if let Some(seed) = p.seed {
            body["seed"] = json!(seed);
        }
        if let Some(m) = req.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if !req.stop.is_empty() {
            body["stop"] = json!(req.stop);
        }
        if let Some(schema) = &req.json_schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": true},
            });
        }
        let mut call = self.http.post(&url).json(&body);
        if let Some(key) = &self.api_key {
            call = call.bearer_auth(key);
        }
        let started = Instant::now();
        let response = call.send().await.map_err(|e| RemoteError::Connect {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(RemoteError::Unauthorized { url });
        }
        if !status.is_success() {
            let text = bounded_text(response, MAX_ERROR_BODY).await;
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or(text);
            return Err(RemoteError::Status {
                url,
                status: status.as_u16(),
                message,
            });
        }

        let protocol = |message: String| RemoteError::Protocol {
            url: url.clone(),
            message,
        };
        let mut body = response.bytes_stream();
        // Bytes, split on newlines before decoding: a character can be split across network
        // chunks, and decoding each chunk alone turned it into U+FFFD (issue 13).
        let mut buf: Vec<u8> = Vec::new();
        let (mut first, mut last) = (None::<Instant>, None::<Instant>);
        let (mut reason, mut usage, mut tokens) = (None, None, 0usize);
        while let Some(bytes) = body.next().await {
            let bytes = bytes.map_err(|e| protocol(format!("stream broke off: {e}")))?;
            buf.extend_from_slice(&bytes);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let raw: Vec<u8> = buf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&raw[..nl]);
                let line = line.trim_end_matches('\r');
                let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                    continue;
                };
                if data == "[DONE]" {
                    let now = last.unwrap_or_else(Instant::now);
                    let decode_s = first.map_or(0.0, |f| now.duration_since(f).as_secs_f64());
                    let usage = usage.unwrap_or(Usage {
                        completion_tokens: tokens,
                        ..Usage::default()
                    });
                    on_event(Event::Done {
                        reason: reason.unwrap_or(StopReason::Stop),
                        usage,
                        timings: Timings {
                            ttft_ms: first
                                .map_or(0.0, |f| f.duration_since(started).as_secs_f64() * 1000.0),
                            prefill_tps: 0.0,
                            decode_tps: if decode_s > 0.0 {
                                tokens.saturating_sub(1) as f64 / decode_s
                            } else {
                                0.0
                            },
                        },
                    });
                    return Ok(());
                }
                let chunk: Value =
                    serde_json::from_str(data).map_err(|e| protocol(format!("bad chunk: {e}")))?;
                if let Some(message) = chunk["error"]["message"].as_str() {
                    return Err(protocol(message.to_owned()));
                }
                if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
                    usage = Some(Usage {
                        prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0) as usize,
                        completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0) as usize,
                        reasoning_tokens: u["completion_tokens_details"]["reasoning_tokens"]
                            .as_u64()
                            .unwrap_or(0) as usize,
                        ..Usage::default()
                    });
                }
                let choice = &chunk["choices"][0];
                let part = |key: &str| choice["delta"][key].as_str().unwrap_or_default();
                let text = part("content");
                // A thinking model's reasoning: `reasoning_content` (vLLM, llama.cpp, DeepSeek)
                // or `reasoning` (Ollama, OpenRouter).
                let reasoning = match part("reasoning_content") {
                    "" => part("reasoning"),
                    r => r,
                };
                if !text.is_empty() || !reasoning.is_empty() {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    tokens += 1;
                    // Remote servers do not send token ids; 0 stands for "unknown".
                    on_event(Event::Token {
                        id: 0,
                        text: text.to_owned(),
                        reasoning: reasoning.to_owned(),
                        candidates: Vec::new(),
                        drafted: false,
                    });
                }
                match choice["finish_reason"].as_str() {
                    Some("length") => reason = Some(StopReason::Length),
                    Some(_) => reason = Some(StopReason::Stop),
                    None => {}
                }
            }
            // What is left is one unfinished line.
            if buf.len() > MAX_LINE {
                return Err(protocol(format!(
                    "a line of the stream ran past {} MB without ending",
                    MAX_LINE >> 20
                )));
            }
        }
        Err(protocol("the stream ended without [DONE]".into()))
    }
}

/// At most `limit` bytes of a response's body, as text.
async fn bounded_text(response: reqwest::Response, limit: usize) -> String {
    let mut body = response.bytes_stream();
    let mut out: Vec<u8> = Vec::new();
    while let Some(Ok(bytes)) = body.next().await {
        out.extend_from_slice(&bytes[..bytes.len().min(limit - out.len())]);
        if out.len() >= limit {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
