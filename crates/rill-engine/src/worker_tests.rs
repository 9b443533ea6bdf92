//! The inference thread survives a panic (issue 40): the answers in flight end with an error
//! and the engine goes on answering, on the real model.

use std::path::PathBuf;

use crate::command::Command;
use crate::{Engine, EngineConfig, Event, GenerateRequest, Message, SamplingParams};

fn model() -> PathBuf {
    std::env::var_os("RILL_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        })
}

fn ask(max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..GenerateRequest::chat(vec![Message::user("Count to a hundred.")])
    }
}

#[test]
fn a_panic_in_the_inference_thread_ends_the_answers_in_flight_and_the_engine_goes_on() {
    let engine = Engine::start(EngineConfig::new(model())).unwrap();
    let handle = engine.handle();
    let mut long = handle.generate(ask(2_000)).unwrap();
    // It streams before the panic.
    loop {
        match long.blocking_next() {
            Some(Event::Token { .. }) => break,
            Some(Event::Started { .. }) => continue,
            other => panic!("expected the answer to stream, got {other:?}"),
        }
    }
    handle.send(Command::Panic).unwrap();
    let error = loop {
        match long.blocking_next() {
            Some(Event::Token { .. }) => continue,
            Some(Event::Error { message }) => break message,
            other => panic!("expected the answer to end with an error, got {other:?}"),
        }
    };
    assert!(
        error.contains("restarted") && error.contains("a panic made by a test"),
        "{error}"
    );
    // The engine answers the next request, whole.
    let after = handle.generate(ask(8)).unwrap().collect_blocking().unwrap();
    assert_eq!(after.usage.completion_tokens, 8, "{after:?}");
}
