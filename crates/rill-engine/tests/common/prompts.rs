//! Conversations for the speculative-decoding tests, the golden prompts and ten more, some of
//! which copy from their prompt (where lookup and drafts shine) and some of which do not; and
//! the ways those tests ask for answers.

use rill_engine::{Collected, Engine, GenerateRequest, Message, SamplingParams, Speculation};

/// Text that an answer copies from: a passage to rewrite.
pub const PASSAGE: &str = "The river carried grain from the hills to the city every spring. \
The boats were long and flat, and the boatmen sang as they poled them past the mills. \
In the city the grain was weighed, sold and baked into bread for the winter.";

pub fn conversations() -> Vec<Vec<Message>> {
    let mut all: Vec<Vec<Message>> = super::golden()
        .cases
        .into_iter()
        .map(|c| c.messages)
        .collect();
    for ask in [
        format!("Repeat this text exactly:\n\n{PASSAGE}"),
        format!("Rewrite this text in the past tense, changing nothing else:\n\n{PASSAGE}"),
        format!("Summarise this text in two sentences:\n\n{PASSAGE}"),
        format!("Quote the second sentence of this text:\n\n{PASSAGE}"),
        "Count from 1 to 30, separated by commas.".to_owned(),
        "List the days of the week, twice.".to_owned(),
        "Write a Python function that adds two numbers, then the same function with type hints."
            .to_owned(),
        "What is the capital of France?".to_owned(),
        "Write the alphabet in capital letters, then in small letters.".to_owned(),
        "Say hello.".to_owned(),
    ] {
        all.push(vec![Message::user(ask)]);
    }
    all
}

/// `req`'s answer from `engine`, whole.
pub fn answer(engine: &Engine, req: GenerateRequest) -> Collected {
    engine
        .handle()
        .generate(req)
        .unwrap()
        .collect_blocking()
        .unwrap()
}

/// A conversation answered greedily (at most 120 tokens) with `speculation`.
pub fn greedy_answer(engine: &Engine, messages: &[Message], speculation: Speculation) -> Collected {
    sampled_answer(engine, messages, SamplingParams::greedy(), speculation)
}

/// A conversation answered under `params` (at most 120 tokens) with `speculation`.
pub fn sampled_answer(
    engine: &Engine,
    messages: &[Message],
    params: SamplingParams,
    speculation: Speculation,
) -> Collected {
    let req = GenerateRequest {
        params,
        max_tokens: Some(120),
        speculation,
        ..GenerateRequest::chat(messages.to_vec())
    };
    answer(engine, req)
}

/// The same request's answer without speculation and with `speculation`.
pub fn plain_and_fast(
    engine: &Engine,
    req: impl Fn(Speculation) -> GenerateRequest,
    speculation: Speculation,
) -> (Collected, Collected) {
    (
        answer(engine, req(Speculation::Off)),
        answer(engine, req(speculation)),
    )
}

/// Greedy answers to several conversations streaming at once, each with its speculation.
pub fn together(engine: &Engine, asks: &[(&[Message], Speculation)]) -> Vec<Collected> {
    let gens: Vec<_> = asks
        .iter()
        .map(|&(m, speculation)| {
            let req = GenerateRequest {
                params: SamplingParams::greedy(),
                max_tokens: Some(120),
                speculation,
                ..GenerateRequest::chat(m.to_vec())
            };
            engine.handle().generate(req).unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = gens
            .into_iter()
            .map(|g| s.spawn(move || g.collect_blocking().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Answers every conversation greedily without speculation and with `speculation`, asserts the
/// two are the same answer (ids, text, reason, length) and that the plain one drafted nothing,
/// and returns the draft tokens (proposed, accepted) over all of them.
pub fn assert_same_greedy_answers(engine: &Engine, speculation: Speculation) -> (usize, usize) {
    let (mut proposed, mut accepted) = (0, 0);
    for messages in conversations() {
        let plain = greedy_answer(engine, &messages, Speculation::Off);
        let fast = greedy_answer(engine, &messages, speculation);
        assert_eq!(fast.ids, plain.ids, "{messages:?}");
        assert_eq!(fast.text, plain.text);
        assert_eq!(fast.reason, plain.reason);
        assert_eq!(fast.usage.completion_tokens, plain.usage.completion_tokens);
        assert_eq!(
            (plain.usage.draft_proposed, plain.usage.draft_accepted),
            (0, 0)
        );
        assert!(fast.usage.draft_accepted <= fast.usage.draft_proposed);
        proposed += fast.usage.draft_proposed;
        accepted += fast.usage.draft_accepted;
    }
    (proposed, accepted)
}

/// Six conversations from `skip` on, sampled (temperature 1, top-p 0.9, a repeat penalty,
/// seeded) without speculation and with `speculation`: asserts the same seed gives the same
/// ids, and returns the draft tokens proposed over all of them.
pub fn assert_same_sampled_answers(
    engine: &Engine,
    skip: usize,
    speculation: Speculation,
) -> usize {
    let mut proposed = 0;
    for (i, messages) in conversations().iter().enumerate().skip(skip).take(6) {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            repeat_penalty: 1.1,
            seed: Some(i as u64),
            ..SamplingParams::default()
        };
        let plain = sampled_answer(engine, messages, params.clone(), Speculation::Off);
        let fast = sampled_answer(engine, messages, params, speculation);
        assert_eq!(fast.ids, plain.ids, "{messages:?}");
        proposed += fast.usage.draft_proposed;
    }
    proposed
}

/// Greedy answers with length limits `maxes`: with `speculation` they end as plain decoding's,
/// at the limit, never past it.
pub fn assert_length_limits_hold(engine: &Engine, speculation: Speculation, maxes: &[usize]) {
    let all = conversations();
    let messages = &all[all.len() - 10];
    for &max in maxes {
        let req = |speculation| GenerateRequest {
            params: SamplingParams::greedy(),
            max_tokens: Some(max),
            speculation,
            ..GenerateRequest::chat(messages.clone())
        };
        let (plain, fast) = plain_and_fast(engine, req, speculation);
        assert_eq!(fast.ids, plain.ids, "max {max}");
        assert_eq!(fast.usage.completion_tokens, max);
        assert_eq!(fast.reason, plain.reason);
    }
}

/// The last four conversations answered at once, the i-th with `kinds[i]`: asserts each is
/// its plain solo answer, and returns them.
pub fn assert_together_as_alone(engine: &Engine, kinds: [Speculation; 4]) -> Vec<Collected> {
    let all = conversations();
    let picked: Vec<&Vec<Message>> = all.iter().rev().take(4).collect();
    let solo: Vec<Collected> = picked
        .iter()
        .map(|m| greedy_answer(engine, m, Speculation::Off))
        .collect();
    let asks: Vec<_> = picked
        .iter()
        .zip(kinds)
        .map(|(m, kind)| (m.as_slice(), kind))
        .collect();
    let answers = together(engine, &asks);
    for ((a, b), kind) in answers.iter().zip(&solo).zip(kinds) {
        assert_eq!(a.ids, b.ids, "{kind:?}");
    }
    answers
}
