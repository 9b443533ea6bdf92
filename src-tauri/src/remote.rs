//! A chat answered by a remote OpenAI-compatible server (vLLM, TGI, Ollama, llama.cpp's
//! server, another Rill) instead of this machine's engine, for when one machine is not
//! enough. It streams through the same channel events and is saved the same way as a local
//! answer; it can be stopped (the partial answer is kept), not paused, and the sampling panel's
//! values go with each request.

use std::sync::Arc;

use rill_engine::Event;
use rill_server::remote::{RemoteClient, RemoteRequest};
use rill_store::{MessageStats, Status};
use tauri::ipc::Channel;
use tauri::{AppHandle, Manager};

use crate::chat_event::ChatEvent;
use crate::error::Result;
use crate::panel::{PanelSettings, RemoteBackend};
use crate::state::{AppState, LiveAnswer, Steer};

/// Starts an answer under `parent` from `backend`; returns its message id at once and streams
/// the rest in the background, like a local answer.
pub async fn answer(
    app: AppHandle,
    state: &AppState,
    conversation: i64,
    parent: Option<i64>,
    settings: PanelSettings,
    backend: RemoteBackend,
    on_event: Channel<ChatEvent>,
) -> Result<i64> {
    backend.validate()?;
    let messages = rill_chat::prompt_under(&state.store, conversation, parent).await?;
    let writer = state
        .store
        .begin_answer(
            conversation,
            parent,
            Some(format!("{} @ {}", backend.model, backend.url)),
            Some(settings.params.to_json()),
        )
        .await?;
    let id = writer.message_id();
    let stop = Arc::new(tokio::sync::Notify::new());
    state.track(
        id,
        LiveAnswer {
            conversation,
            steer: Steer::Remote(stop.clone()),
        },
    )?;
    tauri::async_runtime::spawn(async move {
        let client = RemoteClient::new(&backend.url, &backend.model, backend.api_key.clone());
        let request = RemoteRequest {
            messages,
            params: settings.params,
            stop: Vec::new(),
            max_tokens: settings.max_tokens,
            json_schema: settings.json_schema.clone(),
        };
        let mut done = None;
        let mut tokens = 0usize;
        // A thinking model's reasoning, when the server sends it apart: how many chunks and
        // how long (until the first content).
        let mut reasoning_tokens = 0usize;
        let mut thought_since = None;
        let mut thought_ms = None;
        let outcome = {
            let run = client.generate(&request, |e| match e {
                Event::Token {
                    text, reasoning, ..
                } => {
                    tokens += 1;
                    if !reasoning.is_empty() {
                        reasoning_tokens += 1;
                        thought_since.get_or_insert_with(std::time::Instant::now);
                    } else if let Some(since) = thought_since.filter(|_| thought_ms.is_none()) {
                        thought_ms = Some(since.elapsed().as_secs_f64() * 1000.0);
                    }
                    writer.push_reasoning(&reasoning);
                    writer.push(&text);
                    let _ = on_event.send(ChatEvent::Token {
                        text,
                        reasoning,
                        probs: None,
                        drafted: false,
                    });
                }
                Event::Done { usage, timings, .. } => done = Some((usage, timings)),
                _ => {}
            });
            tokio::select! {
                r = run => Some(r),
                _ = stop.notified() => None,
            }
        };
        let (status, stats, error) = match outcome {
            Some(Ok(())) => {
                let (mut usage, timings) = done.unwrap_or_default();
                if usage.reasoning_tokens == 0 {
                    usage.reasoning_tokens = reasoning_tokens;
                }
                let thought =
                    thought_ms.or(thought_since.map(|s| s.elapsed().as_secs_f64() * 1000.0));
                let stats = rill_chat::stats_of(usage, timings, thought);
                (Status::Done, stats, None)
            }
            Some(Err(e)) => (Status::Error, MessageStats::default(), Some(e.to_string())),
            None => {
                let stats = MessageStats {
                    completion_tokens: Some(tokens as i64),
                    ..Default::default()
                };
                (Status::Stopped, stats, None)
            }
        };
        // A failed request is an answer too: saved with status `error` and the server's words,
        // shown under the message.
        let saved = writer.finish(status, stats, error).await;
        app.state::<AppState>().untrack(id);
        let _ = on_event.send(match saved {
            Ok(message) => ChatEvent::Done {
                message: Box::new(message),
            },
            Err(e) => ChatEvent::Error {
                message: e.to_string(),
            },
        });
    });
    Ok(id)
}
