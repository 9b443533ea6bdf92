//! Token candidates and the next-token preview on the real SmolLM2 model: each token carries
//! its most likely alternatives, raw and after the sliders' sampling, and a preview shows the
//! distribution the next token would be drawn from as the sliders shape it; a bad preview fails
//! clearly.

mod common;

use common::{engine, greedy};
use rill_engine::{
    Distribution, Error, Event, GenerateRequest, Message, PreviewRequest, Prompt, SamplingParams,
};

/// Issue 7: with `top_candidates`, every token comes with the likeliest candidates, their raw
/// probability and their probability in the distribution drawn from.
#[test]
fn tokens_carry_their_candidates_raw_and_after_sampling() {
    let ask = |params: SamplingParams| {
        let req = GenerateRequest {
            params,
            max_tokens: Some(24),
            top_candidates: 8,
            ..GenerateRequest::chat(vec![Message::user("Tell me about the sea.")])
        };
        engine()
            .handle()
            .generate(req)
            .unwrap()
            .filter_map(|e| match e {
                Event::Token { id, candidates, .. } => Some((id, candidates)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };

    // Temperature 0: the drawn token is the one the model found likeliest, drawn for sure.
    let greedy = ask(SamplingParams::greedy());
    assert!(!greedy.is_empty());
    for (id, c) in &greedy {
        assert_eq!(c.len(), 8);
        let raw: f32 = c.iter().map(|c| c.raw).sum();
        assert!(raw <= 1.0 + 1e-4, "{raw}");
        assert!(c.windows(2).all(|w| w[0].raw >= w[1].raw), "sorted by raw");
        assert_eq!(c[0].id, *id);
        assert_eq!(c[0].sampled, 1.0);
        assert!(c[1..].iter().all(|c| c.sampled == 0.0));
    }

    // Temperature 1, top-p 0.5: the nucleus is the likeliest tokens whose raw mass first
    // reaches 0.5; everything outside it has sampled probability 0, and inside it adds to 1
    // when the whole nucleus is among the candidates.
    let nucleus = ask(SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: 0.5,
        min_p: 0.0,
        seed: Some(7),
        ..Default::default()
    });
    for (id, c) in &nucleus {
        let drawn = c
            .iter()
            .find(|c| c.id == *id)
            .expect("the drawn token is listed");
        assert!(drawn.sampled > 0.0);
        let top = &c[..8];
        let mut mass = 0.0;
        let mut inside = 0;
        for cand in top {
            if mass >= 0.5 {
                break;
            }
            mass += cand.raw;
            inside += 1;
        }
        assert!(
            top[inside..].iter().all(|c| c.sampled == 0.0),
            "outside the nucleus: {top:?}"
        );
        if mass >= 0.5 {
            let sampled: f32 = top[..inside].iter().map(|c| c.sampled).sum();
            assert!((sampled - 1.0).abs() < 1e-3, "{sampled} {top:?}");
        }
    }

    // Off by default: no candidates.
    let plain = engine()
        .handle()
        .generate(GenerateRequest {
            params: SamplingParams::greedy(),
            max_tokens: Some(3),
            ..GenerateRequest::chat(vec![Message::user("Hi")])
        })
        .unwrap()
        .filter_map(|e| match e {
            Event::Token { candidates, .. } => Some(candidates.len()),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert!(plain.iter().all(|&n| n == 0), "{plain:?}");
}

fn preview(messages: &[Message], params: SamplingParams) -> Distribution {
    let req = PreviewRequest {
        prompt: Prompt::Messages(messages.to_vec()),
        params,
        top: 8,
    };
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(engine().handle().preview(req))
        .expect("the preview")
}

#[test]
fn preview_shows_the_next_token_distribution_as_the_sliders_shape_it() {
    let chat = [Message::user("Name a colour of the sky.")];
    let at = |temperature: f32, top_p: f32, min_p: f32| {
        preview(
            &chat,
            SamplingParams {
                temperature,
                top_k: None,
                top_p,
                min_p,
                seed: Some(1),
                // No penalties: the softened order is the raw order.
                repeat_penalty: 1.0,
                ..Default::default()
            },
        )
    };

    // The preview is the distribution the answer's first token is drawn from: at temperature
    // 0 its top token is the one a greedy answer starts with, and the raw probabilities equal
    // those reported with that token.
    let greedy = preview(&chat, SamplingParams::greedy());
    let first = engine()
        .handle()
        .generate(GenerateRequest {
            top_candidates: 8,
            ..greedy_chat(&chat, 1)
        })
        .unwrap()
        .find_map(|e| match e {
            Event::Token { id, candidates, .. } => Some((id, candidates)),
            _ => None,
        })
        .expect("a first token");
    assert_eq!(greedy.candidates[0].id, first.0);
    assert_eq!(greedy.candidates[0].sampled, 1.0);
    assert_eq!(greedy.kept, 1);
    // The answer's prompt reused the preview's cache and ran its last token as a one-row step,
    // possibly batched with other answers; the preview ran it inside a prefill chunk. Quantised
    // matmuls round a little differently by batch shape (BENCHMARKS.md, issue 3): close, not
    // bit-equal.
    let mut compared = 0;
    for p in &greedy.candidates {
        if let Some(c) = first.1.iter().find(|c| c.id == p.id) {
            assert!((p.raw - c.raw).abs() < 0.01, "{p:?} {c:?}");
            compared += 1;
        }
    }
    assert!(compared >= 6, "{greedy:?} {:?}", first.1);

    // Lower temperature sharpens: the top token's probability grows, and the raw
    // probabilities (the model's own) do not move.
    let (cool, hot) = (at(0.5, 1.0, 0.0), at(1.5, 1.0, 0.0));
    assert!(
        cool.candidates[0].sampled > hot.candidates[0].sampled,
        "{cool:?} {hot:?}"
    );
    assert_eq!(cool.candidates[0].raw, hot.candidates[0].raw);

    // Top-p 0.5: only the nucleus keeps mass, and what is drawn from adds up to 1.
    let nucleus = at(1.0, 0.5, 0.0);
    let mut mass = 0.0;
    let mut inside = 0;
    for c in &nucleus.candidates {
        if mass >= 0.5 {
            break;
        }
        mass += c.softened;
        inside += 1;
    }
    if mass >= 0.5 {
        assert_eq!(nucleus.after_top_p, inside, "{nucleus:?}");
    }
    assert!(
        nucleus.candidates[inside..]
            .iter()
            .all(|c| c.sampled == 0.0),
        "{nucleus:?}"
    );
    let sampled: f32 = nucleus.candidates.iter().map(|c| c.sampled).sum();
    assert!(sampled <= 1.0 + 1e-4, "{sampled}");
    if mass >= 0.5 {
        assert!((sampled - 1.0).abs() < 1e-3, "{sampled}");
    }

    // Min-p: nothing below the floor survives.
    let floored = at(1.0, 1.0, 0.2);
    assert!((floored.min_p_floor - 0.2 * floored.candidates[0].softened).abs() < 1e-6);
    for c in &floored.candidates {
        assert_eq!(
            c.sampled > 0.0,
            c.softened >= floored.min_p_floor,
            "{floored:?}"
        );
    }
    // Raw probabilities are a distribution's top: at most 1 in all.
    let raw: f32 = floored.candidates.iter().map(|c| c.raw).sum();
    assert!(raw <= 1.0 + 1e-4);
}

fn greedy_chat(chat: &[Message], max_tokens: usize) -> GenerateRequest {
    greedy(Prompt::Messages(chat.to_vec()), max_tokens)
}

#[test]
fn a_bad_preview_fails_clearly() {
    let h = engine().handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let bad = PreviewRequest {
        prompt: Prompt::Messages(vec![Message::user("Hi")]),
        params: SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        top: 8,
    };
    let err = rt.block_on(h.preview(bad)).unwrap_err();
    assert!(matches!(err, Error::InvalidParam { .. }), "{err}");
    let empty = PreviewRequest {
        prompt: Prompt::Messages(vec![Message::user("   ")]),
        params: SamplingParams::default(),
        top: 8,
    };
    assert!(rt.block_on(h.preview(empty)).is_err());
}
