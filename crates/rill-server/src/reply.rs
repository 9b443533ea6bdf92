//! Answering a request: the whole answer as one JSON object, or a stream of server-sent events,
//! in the shape of the endpoint asked ([`Kind`]). With `--save`, the request's conversation is
//! stored first and the answer goes through `rill_chat`'s streaming writer, as the window's and
//! the CLI's do: it is on disk within 250 ms as it streams (a crash loses at most that), it ends
//! `done`, `stopped` (the client hung up) or `error` (the engine failed mid-answer).

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use rill_chat::Answering;
use rill_engine::tools::ToolFormat;
use rill_engine::{Event, GenerateRequest, Generation, Handle, Message, StopReason};
use rill_store::Store;
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;

use crate::api::{finish_reason, Usage};
use crate::error::ApiError;
use crate::tools::{Delta, Reader};
use crate::{now, AppState};

/// Which endpoint a generation answers: they differ only in the shape of their JSON.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
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

    /// One choice: a chunk's `delta` (`None` for the last chunk, which carries only the
    /// finish reason) or the whole `message`.
    fn choice(
        self,
        d: Option<&Delta>,
        finish: Option<&str>,
        chunk: bool,
        first: bool,
        logprobs: Value,
    ) -> Value {
        let last = d.is_none();
        let empty = Delta::default();
        let d = d.unwrap_or(&empty);
        match (self, chunk) {
            (Kind::Chat, true) => {
                let mut delta = json!({});
                if first {
                    delta["role"] = json!("assistant");
                }
                // A reasoning or call chunk carries no `content` (OpenAI-style clients
                // concatenate the fields); the finish chunk carries nothing.
                let plain = d.reasoning.is_empty() && d.calls.is_empty();
                if !last && (!d.content.is_empty() || plain) {
                    delta["content"] = json!(d.content);
                }
                if !d.reasoning.is_empty() {
                    delta["reasoning_content"] = json!(d.reasoning);
                }
                if !d.calls.is_empty() {
                    delta["tool_calls"] = json!(d.calls);
                }
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs})
            }
            (Kind::Chat, false) => {
                let mut message = json!({"role": "assistant", "content": d.content});
                if !d.reasoning.is_empty() {
                    message["reasoning_content"] = json!(d.reasoning);
                }
                if !d.calls.is_empty() {
                    message["tool_calls"] = json!(d.calls);
                    if d.content.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs})
            }
            (Kind::Text, _) => {
                json!({"index": 0, "text": d.content, "finish_reason": finish, "logprobs": logprobs})
            }
        }
    }

    /// A choice's `logprobs` from tokens' entries ([`logprob_entry`]; `None` when none were
    /// asked for): chat's `{"content": [...]}`, or the legacy completions' parallel lists
    /// (`tokens`, `token_logprobs`, `top_logprobs` as maps of alternative to log-probability,
    /// `text_offset` in characters from the answer's start, where these tokens begin at
    /// `offset`), as OpenAI's official client reads them.
    fn logprobs(self, entries: Option<Vec<Value>>, offset: usize) -> Value {
        let Some(entries) = entries else {
            return Value::Null;
        };
        if matches!(self, Kind::Chat) {
            return json!({ "content": entries });
        }
        let mut at = offset;
        let (mut tokens, mut own, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
        for e in entries {
            offsets.push(at);
            let text = e["token"].as_str().unwrap_or_default();
            at += text.chars().count();
            tokens.push(json!(text));
            own.push(e["logprob"].clone());
            let top: serde_json::Map<String, Value> = e["top_logprobs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    (
                        a["token"].as_str().unwrap_or_default().to_owned(),
                        a["logprob"].clone(),
                    )
                })
                .collect();
            tops.push(Value::Object(top));
        }
        json!({"tokens": tokens, "token_logprobs": own, "top_logprobs": tops, "text_offset": offsets})
    }
}

/// How the client wants its answer.
pub(crate) struct Reply {
    pub kind: Kind,
    pub stream: bool,
    pub include_usage: bool,
    /// `top_logprobs`, when log-probabilities were asked for.
    pub logprobs: Option<usize>,
    /// How the model writes tool calls, when the answer is to be read for them.
    pub tools: Option<ToolFormat>,
}

/// OpenAI's `finish_reason`: `tool_calls` when the model called and stopped by itself.
fn finish(reason: StopReason, reader: &Reader) -> &'static str {
    match finish_reason(reason) {
        "stop" if reader.called() => "tool_calls",
        other => other,
    }
}

/// Where a reply's events come from: the engine alone, or the engine through `rill_chat`,
/// each event saved before it is sent. Dropping it mid-answer stops the generation; a saved
/// answer is then kept as `stopped`.
enum Source {
    Plain(Generation),
    Saved(Option<Box<Answering>>),
}

impl Source {
    fn id(&self) -> u64 {
        match self {
            Source::Plain(g) => g.control().id(),
            Source::Saved(a) => a.as_ref().map_or(0, |a| a.control().id()),
        }
    }

    async fn next(&mut self) -> Option<Event> {
        match self {
            Source::Plain(g) => g.next_event().await,
            Source::Saved(a) => match a.as_mut()?.next_event().await {
                Ok(Some((event, _))) => Some(event),
                Ok(None) => None,
                Err(e) => Some(Event::Error {
                    message: e.to_string(),
                }),
            },
        }
    }
}

impl Source {
    /// A saved answer that called tools keeps them as calls (the window's call cards), its
    /// content without their text: `called` is [`Reader::called_with`]'s. Before the source
    /// goes: the answer is saved by then.
    async fn keep_calls(&self, called: Option<(String, Vec<rill_engine::ToolCall>)>) {
        let (Source::Saved(Some(a)), Some((content, calls))) = (self, called) else {
            return;
        };
        if let Err(e) = a.save_calls(&content, &calls).await {
            tracing::warn!(error = %e, "could not save the answer's tool calls");
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        if let Source::Saved(a) = self {
            if let Some(a) = a.take() {
                a.stop_in_background(); // nothing to do when it ended
            }
        }
    }
}

/// Stores the request's conversation (its system prompt apart, as the window keeps it) and
/// starts the answer under its last message.
async fn begin_saved(
    handle: &Handle,
    store: &Store,
    messages: &[Message],
    request: GenerateRequest,
) -> Result<Answering, ApiError> {
    use rill_store::{MessageStats, NewConversation, NewMessage, Role as R};
    let system = messages
        .iter()
        .find(|m| m.role == rill_engine::Role::System)
        .map(|m| m.content.clone());
    let turns: Vec<NewMessage> = messages
        .iter()
        .filter(|m| m.role != rill_engine::Role::System)
        .map(|m| {
            let role = match m.role {
                rill_engine::Role::User => R::User,
                rill_engine::Role::Tool => R::Tool,
                _ => R::Assistant,
            };
            NewMessage {
                tool_calls: (!m.tool_calls.is_empty())
                    .then(|| rill_chat::calls_json(&m.tool_calls)),
                tool_call_id: m.tool_call_id.clone(),
                images: m.images.iter().map(|i| i.bytes().to_vec()).collect(),
                ..NewMessage::new(role, m.content.clone())
            }
        })
        .collect();
    let conversation = NewConversation {
        model: Some(handle.model_info().name.clone()),
        system_prompt: system,
        settings: Some(request.params.to_json()),
    };
    let store_error = |e: rill_store::Error| ApiError::internal(format!("saving: {e}"));
    let id = store
        .save_conversation(conversation, &turns, &MessageStats::default())
        .await
        .map_err(store_error)?;
    let leaf = store
        .conversation(id)
        .await
        .map_err(store_error)?
        .current_leaf_id;
    rill_chat::begin_request(handle, store, id, leaf, request)
        .await
        .map_err(|e| match e {
            rill_chat::Error::Engine(e) => ApiError::from(e),
            other => ApiError::internal(other.to_string()),
        })
}

/// Runs `f` on tokio's blocking threads; a panic in it stays a panic.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Ok(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}

/// Starts the generation (saving it when `save` names a store and the conversation) and
/// answers in the way `reply` asks.
pub(crate) async fn respond(
    s: AppState,
    reply: Reply,
    request: GenerateRequest,
    save: Option<(Store, Vec<Message>)>,
) -> Result<Response, ApiError> {
    // Everything that costs compute runs inside a slot and off the async threads (issue 40):
    // a flood of requests with huge prompts or grammars waits for slots or gets 503, and never
    // holds the workers that answer everyone else.
    let permit = s
        .slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::busy())?;
    if let Some(g) = &request.grammar {
        // Refused before anything is saved or started, naming the field it came from.
        let (handle, grammar) = (s.handle.clone(), g.clone());
        blocking(move || handle.check_grammar(&grammar))
            .await?
            .map_err(|e| ApiError::invalid(crate::api::grammar_field(g), e.to_string()))?;
    }
    let mut source = match save {
        None => {
            // Rendering the template and tokenising the prompt: off the async threads.
            let handle = s.handle.clone();
            Source::Plain(blocking(move || handle.generate(request)).await??)
        }
        Some((store, messages)) => Source::Saved(Some(Box::new(
            begin_saved(&s.handle, &store, &messages, request).await?,
        ))),
    };
    let kind = reply.kind;
    let id = format!(
        "{}-{}",
        if matches!(kind, Kind::Chat) {
            "chatcmpl"
        } else {
            "cmpl"
        },
        source.id()
    );
    let logprobs = reply.logprobs.map(|top| (s.handle.clone(), top));
    if reply.stream {
        let reader = Reader::new(reply.tools, call_seed(source.id()));
        let events = sse_stream(
            source,
            reader,
            permit,
            kind,
            id,
            s.model_id.clone(),
            reply.include_usage,
            logprobs,
        );
        return Ok(Sse::new(events).into_response());
    }
    let mut reader = Reader::new(reply.tools, call_seed(source.id()));
    let mut entries = logprobs.as_ref().map(|_| Vec::new());
    while let Some(event) = source.next().await {
        match event {
            Event::Token {
                text,
                reasoning,
                id,
                candidates,
                ..
            } => {
                reader.read(&text, &reasoning);
                if let (Some(e), Some((h, top))) = (entries.as_mut(), &logprobs) {
                    e.push(logprob_entry(h.tokenizer(), id, &candidates, *top));
                }
            }
            Event::Done { reason, usage, .. } => {
                drop(permit);
                reader.finish();
                source.keep_calls(reader.called_with()).await;
                let (content, reasoning, calls) = reader.whole();
                let whole = Delta {
                    content: content.to_owned(),
                    reasoning: reasoning.to_owned(),
                    calls,
                };
                let finish = finish(reason, &reader);
                return Ok(Json(json!({
                    "id": id, "object": kind.object(false), "created": now(), "model": s.model_id,
                    "choices": [kind.choice(Some(&whole), Some(finish), false, false, kind.logprobs(entries, 0))],
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

/// A seed for an answer's call ids: its generation's id and the clock, so ids differ across
/// answers and server runs.
fn call_seed(generation: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ generation.rotate_left(32)
}

/// The answer as server-sent events: a chunk per token, a last chunk with `finish_reason`, the
/// usage chunk if asked for, then `[DONE]`. Dropping the stream (the client left) drops the
/// source, which cancels the generation.
#[allow(clippy::too_many_arguments)]
fn sse_stream(
    source: Source,
    reader: Reader,
    permit: OwnedSemaphorePermit,
    kind: Kind,
    id: String,
    model: String,
    include_usage: bool,
    logprobs: Option<(Handle, usize)>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    struct St {
        source: Option<Source>,
        reader: Reader,
        _permit: OwnedSemaphorePermit,
        first: bool,
        tail: Vec<SseEvent>,
        /// Characters of the answer sent so far (the legacy logprobs' `text_offset`).
        sent: usize,
    }
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
            source: Some(source),
            reader,
            _permit: permit,
            first: true,
            tail: Vec::new(),
            sent: 0,
        },
        move |mut st| {
            let chunk = chunk.clone();
            let logprobs = logprobs.clone();
            async move {
                loop {
                    if !st.tail.is_empty() {
                        let ev = st.tail.remove(0);
                        return Some((Ok(ev), st));
                    }
                    let source = st.source.as_mut()?;
                    match source.next().await {
                        Some(Event::Token {
                            text,
                            reasoning,
                            id,
                            candidates,
                            ..
                        }) => {
                            let delta = st.reader.read(&text, &reasoning);
                            if delta.is_empty() && !st.first && logprobs.is_none() {
                                continue;
                            }
                            let entry = logprobs.as_ref().map(|(h, top)| {
                                vec![logprob_entry(h.tokenizer(), id, &candidates, *top)]
                            });
                            let shaped = kind.logprobs(entry, st.sent);
                            st.sent += text.chars().count();
                            let ev = chunk(
                                json!([kind.choice(Some(&delta), None, true, st.first, shaped)]),
                                None,
                            );
                            st.first = false;
                            return Some((Ok(ev), st));
                        }
                        Some(Event::Done { reason, usage, .. }) => {
                            let rest = st.reader.finish();
                            if let Some(source) = st.source.take() {
                                source.keep_calls(st.reader.called_with()).await;
                            }
                            if !rest.is_empty() {
                                st.tail.push(chunk(
                                    json!([kind.choice(
                                        Some(&rest),
                                        None,
                                        true,
                                        st.first,
                                        Value::Null
                                    )]),
                                    None,
                                ));
                                st.first = false;
                            }
                            let finish = finish(reason, &st.reader);
                            st.tail.push(chunk(
                                json!([kind.choice(
                                    None,
                                    Some(finish),
                                    true,
                                    st.first,
                                    Value::Null
                                )]),
                                None,
                            ));
                            if include_usage {
                                st.tail.push(chunk(json!([]), Some(usage.into())));
                            }
                            st.tail.push(SseEvent::default().data("[DONE]"));
                        }
                        Some(Event::Error { message }) => {
                            st.source = None;
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

#[cfg(test)]
mod tests {
    use super::{Delta, Kind};

    #[test]
    fn reasoning_goes_to_reasoning_content_whole_and_streamed() {
        let d = |content: &str, reasoning: &str| Delta {
            content: content.into(),
            reasoning: reasoning.into(),
            calls: Vec::new(),
        };
        let whole = Kind::Chat.choice(
            Some(&d("51.", "17 × 3 is 51.")),
            Some("stop"),
            false,
            false,
            serde_json::Value::Null,
        );
        assert_eq!(whole["message"]["content"], "51.");
        assert_eq!(whole["message"]["reasoning_content"], "17 × 3 is 51.");
        let plain = Kind::Chat.choice(
            Some(&d("51.", "")),
            Some("stop"),
            false,
            false,
            serde_json::Value::Null,
        );
        assert!(
            plain["message"].get("reasoning_content").is_none(),
            "{plain}"
        );

        let thinking = Kind::Chat.choice(
            Some(&d("", "17 × 3")),
            None,
            true,
            true,
            serde_json::Value::Null,
        );
        assert_eq!(thinking["delta"]["reasoning_content"], "17 × 3");
        assert_eq!(thinking["delta"]["role"], "assistant");
        assert!(thinking["delta"].get("content").is_none(), "{thinking}");
        let answer = Kind::Chat.choice(
            Some(&d("51", "")),
            None,
            true,
            false,
            serde_json::Value::Null,
        );
        assert_eq!(answer["delta"]["content"], "51");
        assert!(
            answer["delta"].get("reasoning_content").is_none(),
            "{answer}"
        );
        let last = Kind::Chat.choice(None, Some("stop"), true, false, serde_json::Value::Null);
        assert_eq!(last["delta"], serde_json::json!({}));
    }

    #[test]
    fn calls_go_to_tool_calls_and_a_message_of_calls_alone_has_null_content() {
        let call = serde_json::json!({"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}});
        let d = Delta {
            content: String::new(),
            reasoning: String::new(),
            calls: vec![call.clone()],
        };
        let whole = Kind::Chat.choice(
            Some(&d),
            Some("tool_calls"),
            false,
            false,
            serde_json::Value::Null,
        );
        assert_eq!(whole["message"]["content"], serde_json::Value::Null);
        assert_eq!(whole["message"]["tool_calls"][0], call);
        let chunk = Kind::Chat.choice(Some(&d), None, true, false, serde_json::Value::Null);
        assert!(chunk["delta"].get("content").is_none(), "{chunk}");
        assert_eq!(chunk["delta"]["tool_calls"][0], call);
    }
}
