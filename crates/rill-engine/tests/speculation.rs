//! Speculative decoding by prompt lookup (issue 17), on the real SmolLM2 model: the answer is
//! exactly plain decoding's, greedy and sampled, alone and with four answers streaming at once,
//! while the model checks several proposed tokens per pass.

mod common;

use std::sync::OnceLock;

use common::{golden, model_path};
use rill_engine::{
    Collected, Engine, EngineConfig, GenerateRequest, Message, SamplingParams, Speculation,
};

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::start(EngineConfig::new(model_path())).expect("model loads"))
}

/// Text that an answer copies from: a passage to rewrite.
const PASSAGE: &str = "The river carried grain from the hills to the city every spring. \
The boats were long and flat, and the boatmen sang as they poled them past the mills. \
In the city the grain was weighed, sold and baked into bread for the winter.";

fn conversations() -> Vec<Vec<Message>> {
    let mut all: Vec<Vec<Message>> = golden().cases.into_iter().map(|c| c.messages).collect();
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

fn run(messages: &[Message], params: SamplingParams, speculation: Speculation) -> Collected {
    let req = GenerateRequest {
        params,
        max_tokens: Some(120),
        speculation,
        ..GenerateRequest::chat(messages.to_vec())
    };
    engine()
        .handle()
        .generate(req)
        .unwrap()
        .collect_blocking()
        .unwrap()
}

#[test]
fn lookup_gives_exactly_the_plain_greedy_answers() {
    let (mut proposed, mut accepted) = (0, 0);
    for messages in conversations() {
        let plain = run(&messages, SamplingParams::greedy(), Speculation::Off);
        let fast = run(&messages, SamplingParams::greedy(), Speculation::Lookup);
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
    // The path was taken: drafts were proposed, and the copying answers took many of them.
    println!("lookup: {accepted} of {proposed} proposed tokens accepted");
    assert!(proposed > 100 && accepted > 50, "{accepted} of {proposed}");
}

#[test]
fn lookup_gives_exactly_the_plain_sampled_answers() {
    // Each position's token is drawn from the model's logits with the answer's own sampler, as
    // plain decoding draws it: the same seed gives the same text.
    for (i, messages) in conversations().iter().enumerate().skip(6).take(6) {
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            repeat_penalty: 1.1,
            seed: Some(i as u64),
            ..SamplingParams::default()
        };
        let plain = run(messages, params.clone(), Speculation::Off);
        let fast = run(messages, params, Speculation::Lookup);
        assert_eq!(fast.ids, plain.ids, "{messages:?}");
    }
}

#[test]
fn four_answers_at_once_with_lookup_are_their_plain_answers() {
    let all = conversations();
    let picked: Vec<&Vec<Message>> = all.iter().rev().take(4).collect();
    let solo: Vec<Collected> = picked
        .iter()
        .map(|m| run(m, SamplingParams::greedy(), Speculation::Off))
        .collect();
    let gens: Vec<_> = picked
        .iter()
        .map(|m| {
            let req = GenerateRequest {
                params: SamplingParams::greedy(),
                max_tokens: Some(120),
                speculation: Speculation::Lookup,
                ..GenerateRequest::chat(m.to_vec())
            };
            engine().handle().generate(req).unwrap()
        })
        .collect();
    let together: Vec<Collected> = std::thread::scope(|s| {
        let handles: Vec<_> = gens
            .into_iter()
            .map(|g| s.spawn(move || g.collect_blocking().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (a, b) in together.iter().zip(&solo) {
        assert_eq!(a.ids, b.ids);
    }
}

#[test]
fn a_draft_never_runs_past_the_length_limit() {
    let messages = &conversations()[conversations().len() - 10];
    for max in [1, 2, 5, 9] {
        let req = |speculation| GenerateRequest {
            params: SamplingParams::greedy(),
            max_tokens: Some(max),
            speculation,
            ..GenerateRequest::chat(messages.clone())
        };
        let h = engine().handle();
        let plain = h
            .generate(req(Speculation::Off))
            .unwrap()
            .collect_blocking()
            .unwrap();
        let fast = h
            .generate(req(Speculation::Lookup))
            .unwrap()
            .collect_blocking()
            .unwrap();
        assert_eq!(fast.ids, plain.ids, "max {max}");
        assert_eq!(fast.reason, plain.reason);
    }
}

#[test]
fn drafts_that_always_fail_change_nothing_and_back_off() {
    // A proposer the model always refuses: the answers are still exactly plain decoding's, and
    // after two misses it pauses, longer each time, so few drafts are checked at all.
    for messages in conversations().iter().skip(6).take(3) {
        let plain = run(messages, SamplingParams::greedy(), Speculation::Off);
        let wrong = run(messages, SamplingParams::greedy(), Speculation::Contrary);
        assert_eq!(wrong.ids, plain.ids, "{messages:?}");
        assert_eq!(wrong.usage.draft_accepted, 0);
        let steps = wrong.usage.completion_tokens;
        assert!(
            steps < 30 || wrong.usage.draft_proposed < steps,
            "{} drafted for {steps} tokens",
            wrong.usage.draft_proposed
        );
    }
}
