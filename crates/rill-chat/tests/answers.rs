//! Answers saved as they stream, on the real model and a real SQLite file.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rill_chat::AnswerOptions;
use rill_engine::{Engine, EngineConfig, Event, SamplingParams, StopReason};
use rill_store::{NewConversation, NewMessage, Status, Store};

fn model() -> PathBuf {
    let p = std::env::var_os("RILL_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(p.is_file(), "test model missing at {}", p.display());
    p
}

/// Issue 13: an engine that stops under its answers (the window switching to another model,
/// or closing) ends each as a stopped answer holding every token it streamed, as state.rs says:
/// not an error, and continuable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_an_engine_that_stops_are_kept_as_stopped_with_their_text() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("rill.db")).await.unwrap();
    let conversation = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap()
        .id;
    let question = store
        .append(
            conversation,
            NewMessage::user("Write a long essay about the history of the river boats of Europe."),
        )
        .await
        .unwrap();
    let engine = Engine::start(EngineConfig::new(model())).unwrap();
    let options = AnswerOptions {
        params: SamplingParams::greedy(),
        max_tokens: Some(400),
        ..Default::default()
    };
    let answering = rill_chat::begin(
        &engine.handle(),
        &store,
        conversation,
        Some(question.id),
        options,
    )
    .await
    .unwrap();
    let id = answering.message_id();
    let shown = Arc::new(Mutex::new(String::new()));
    let task = {
        let shown = shown.clone();
        tokio::spawn(answering.finish(move |e| {
            if let Event::Token { text, .. } = e {
                shown.lock().unwrap().push_str(text);
            }
        }))
    };
    let t = Instant::now();
    while shown.lock().unwrap().len() < 40 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the answer did not stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The model switch: the old engine is dropped (its thread stops after the current step).
    tokio::task::spawn_blocking(move || drop(engine))
        .await
        .unwrap();
    let answer = task.await.unwrap().unwrap();
    assert_eq!(answer.reason, StopReason::Cancelled);
    assert_eq!(answer.message.status, Status::Stopped);
    assert_eq!(answer.message.content, *shown.lock().unwrap());
    let stored = store.message(id).await.unwrap();
    assert_eq!(
        (stored.status, stored.content),
        (Status::Stopped, answer.message.content)
    );
}
