//! Speculative decoding by prompt lookup (issue 17), on the real SmolLM2 model: the answer is
//! exactly plain decoding's, greedy and sampled, alone and with four answers streaming at once,
//! while the model checks several proposed tokens per pass.

mod common;

use std::sync::OnceLock;

use common::model_path;
use common::prompts::{
    assert_length_limits_hold, assert_same_greedy_answers, assert_same_sampled_answers,
    assert_together_as_alone, conversations, greedy_answer,
};
use rill_engine::{Engine, EngineConfig, Speculation};

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    // Drafts are checked whatever they cost (no weighing): these tests are of the text.
    ENGINE.get_or_init(|| {
        let config = EngineConfig {
            weigh_speculation: false,
            ..EngineConfig::new(model_path())
        };
        Engine::start(config).expect("model loads")
    })
}

#[test]
fn lookup_gives_exactly_the_plain_greedy_answers() {
    let (proposed, accepted) = assert_same_greedy_answers(engine(), Speculation::Lookup);
    // The path was taken: drafts were proposed, and the copying answers took many of them.
    println!("lookup: {accepted} of {proposed} proposed tokens accepted");
    assert!(proposed > 100 && accepted > 50, "{accepted} of {proposed}");
}

#[test]
fn lookup_gives_exactly_the_plain_sampled_answers() {
    // Each position's token is drawn from the model's logits with the answer's own sampler, as
    // plain decoding draws it: the same seed gives the same text.
    assert_same_sampled_answers(engine(), 6, Speculation::Lookup);
}

#[test]
fn four_answers_at_once_with_lookup_are_their_plain_answers() {
    assert_together_as_alone(engine(), [Speculation::Lookup; 4]);
}

#[test]
fn a_draft_never_runs_past_the_length_limit() {
    assert_length_limits_hold(engine(), Speculation::Lookup, &[1, 2, 5, 9]);
}

#[test]
fn drafts_that_always_fail_change_nothing_and_back_off() {
    // A proposer the model always refuses: the answers are still exactly plain decoding's, and
    // after two misses it pauses, longer each time, so few drafts are checked at all.
    for messages in conversations().iter().skip(6).take(3) {
        let plain = greedy_answer(engine(), messages, Speculation::Off);
        let wrong = greedy_answer(engine(), messages, Speculation::Contrary);
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

#[test]
fn the_tokens_a_draft_proposed_and_the_model_drew_are_marked() {
    // The window tints them: every drawn draft token says so, and no other token does.
    use rill_engine::{Event, GenerateRequest, SamplingParams, StopReason};
    let mut marked_in_all = 0;
    // Five of the ten extra asks: counting, lists, code, a quote, a summary.
    for messages in conversations().iter().rev().skip(3).take(5) {
        for speculation in [Speculation::Off, Speculation::Contrary, Speculation::Lookup] {
            let req = GenerateRequest {
                params: SamplingParams::greedy(),
                max_tokens: Some(120),
                speculation,
                ..GenerateRequest::chat(messages.to_vec())
            };
            let (mut marked, mut usage, mut reason) = (0, None, None);
            for event in engine().handle().generate(req).unwrap() {
                match event {
                    Event::Token { drafted, .. } => marked += usize::from(drafted),
                    Event::Done {
                        usage: u,
                        reason: r,
                        ..
                    } => (usage, reason) = (Some(u), Some(r)),
                    _ => {}
                }
            }
            let usage = usage.expect("the answer ends");
            // A drawn end token counts as accepted but is no token of the answer.
            let end = usize::from(reason == Some(StopReason::Stop));
            assert!(
                marked <= usage.draft_accepted && marked + end >= usage.draft_accepted,
                "{speculation:?}: {marked} marked, {} accepted",
                usage.draft_accepted
            );
            if speculation != Speculation::Lookup {
                assert_eq!(marked, 0, "{speculation:?}");
            }
            marked_in_all += marked;
        }
    }
    assert!(marked_in_all > 20, "{marked_in_all}");
}
