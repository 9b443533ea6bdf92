//! What the flow's tests share: an engine on the real model, greedy requests, waiting.

use std::time::{Duration, Instant};

use rill_engine::{
    Engine, EngineConfig, Event, GenerateRequest, Generation, Message, SamplingParams, Speculation,
};

use super::model_path;

/// An engine of its own on the real model, `config` changing its settings.
pub fn engine(config: impl FnOnce(EngineConfig) -> EngineConfig) -> Engine {
    Engine::start(config(EngineConfig::new(model_path()))).unwrap()
}

/// A greedy chat request of one user message, ignoring end-of-generation.
pub fn greedy(question: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..GenerateRequest::chat(vec![Message::user(question)])
    }
}

/// Polls `cond` until it holds; fails after a minute.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads events until `n` tokens have arrived; returns their ids.
pub fn take_tokens(gen: &mut Generation, n: usize) -> Vec<u32> {
    let mut ids = Vec::new();
    while ids.len() < n {
        match gen.blocking_next().expect("generation ended early") {
            Event::Token { id, .. } => ids.push(id),
            Event::Done { reason, .. } => panic!("done ({reason:?}) after {} tokens", ids.len()),
            _ => {}
        }
    }
    ids
}

/// A question with a long answer, and one with a short answer.
pub const LONG: &str = "Write a long essay about the history of the river boats of Europe.";
pub const SHORT: &str = "What is the capital of France? Answer in one word.";

/// A greedy request of 40 tokens for `messages`, ignoring end-of-generation, with
/// `speculation`.
pub fn greedy_40(messages: Vec<Message>, speculation: Speculation) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(40),
        ignore_eos: true,
        speculation,
        ..GenerateRequest::chat(messages)
    }
}

/// An answer's token ids, the prompt tokens it reused, and its drafts (proposed, accepted).
pub fn run(engine: &Engine, req: GenerateRequest) -> (Vec<u32>, usize, (usize, usize)) {
    let (mut ids, mut reused, mut drafts) = (Vec::new(), 0, (0, 0));
    for ev in engine.handle().generate(req).unwrap() {
        match ev {
            Event::Started { reused_tokens, .. } => reused = reused_tokens,
            Event::Token { id, .. } => ids.push(id),
            Event::Done { usage, .. } => drafts = (usage.draft_proposed, usage.draft_accepted),
            Event::Error { message } => panic!("{message}"),
            _ => {}
        }
    }
    (ids, reused, drafts)
}

/// `req`'s token ids when it is paused after `after` tokens for 300 ms and resumed.
pub fn paused_and_resumed(engine: &Engine, req: GenerateRequest, after: usize) -> Vec<u32> {
    let mut gen = engine.handle().generate(req).unwrap();
    let mut ids = take_tokens(&mut gen, after);
    gen.pause().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    gen.resume().unwrap();
    ids.extend(gen.collect_blocking().unwrap().ids);
    ids
}
