//! Speculative decoding with a draft model (issue 17), on the real SmolLM2 model: a draft that
//! is always right (the model as its own draft) and one that is always wrong leave the greedy
//! answers exactly plain decoding's, alone and four at once; with sampling, a checked position
//! is drawn from the model's own distribution (a chi-square test over 4,000 seeds).
//! A draft of another vocabulary is refused at load.

mod common;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use candle_core::Device;
use common::prompts::{
    assert_length_limits_hold, assert_same_greedy_answers, assert_same_sampled_answers,
    assert_together_as_alone, plain_and_fast,
};
use common::{model_path, test_model};
use rill_engine::model::{KvCache, Model};
use rill_engine::{
    Engine, EngineConfig, Error, GenerateRequest, Prompt, SamplingParams, Speculation,
};
use statrs::distribution::{ChiSquared, ContinuousCDF};

/// SmolLM2 drafting for itself: every proposal is the model's own greedy choice. Drafts are
/// checked whatever they cost (no weighing): these tests are of the text, not the speed.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::start(EngineConfig {
            draft_model: Some(model_path()),
            weigh_speculation: false,
            ..EngineConfig::new(model_path())
        })
        .expect("model and draft load")
    })
}

#[test]
fn an_always_right_draft_gives_exactly_the_plain_greedy_answers() {
    let (proposed, accepted) = assert_same_greedy_answers(engine(), Speculation::Draft);
    // The model as its own draft proposes its own greedy tokens: all are accepted, except
    // those past an end the draft does not know about (a stop, the end of the answer).
    println!("self-draft: {accepted} of {proposed} proposed tokens accepted");
    assert!(proposed > 500, "{proposed} proposed");
    assert!(accepted * 100 >= proposed * 90, "{accepted} of {proposed}");
}

#[test]
fn an_always_right_draft_gives_exactly_the_plain_sampled_answers() {
    let proposed = assert_same_sampled_answers(engine(), 4, Speculation::Draft);
    assert!(proposed > 0);
}

#[test]
fn four_answers_drafting_at_once_are_their_plain_answers() {
    // Two draft with the model, one by lookup, one with drafts that always fail.
    let answers = assert_together_as_alone(
        engine(),
        [
            Speculation::Draft,
            Speculation::Lookup,
            Speculation::Draft,
            Speculation::Contrary,
        ],
    );
    assert!(answers[0].usage.draft_accepted > 0);
}

#[test]
fn a_draft_never_runs_past_the_length_limit() {
    assert_length_limits_hold(engine(), Speculation::Draft, &[1, 2, 3, 7]);
}

/// Temperature 1 and top-p 0.9, nothing else: the distribution is the model's softmax cut to
/// the smallest set of likeliest tokens whose probability reaches 0.9, renormalised.
fn sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: 0.9,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplingParams::greedy()
    }
}

/// What top-p 0.9 keeps of `logits`, as (token, probability).
fn nucleus(logits: &[f32]) -> Vec<(u32, f64)> {
    let max = logits.iter().copied().fold(f32::MIN, f32::max) as f64;
    let mut p: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, (l as f64 - max).exp()))
        .collect();
    let sum: f64 = p.iter().map(|x| x.1).sum();
    p.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut cum = 0.0;
    let mut keep = p.len();
    for (i, x) in p.iter().enumerate() {
        cum += x.1 / sum;
        if cum >= 0.9 {
            keep = i + 1;
            break;
        }
    }
    p.truncate(keep);
    let kept: f64 = p.iter().map(|x| x.1).sum();
    p.iter().map(|&(t, x)| (t, x / kept)).collect()
}

/// Draws an answer's first token under 4,000 seeds and returns the chi-square test's p-value
/// of the draws against the model's own distribution. The step that ends the prompt checks a
/// draft of one token (the length limit, 2, leaves room for one), so the first token is drawn
/// at a checked position. The prompt is short and 32 answers run at once, so the 4,000 take
/// seconds.
fn first_checked_token_p_value(speculation: Speculation) -> f64 {
    const DRAWS: u64 = 4000;
    let prompt = engine()
        .handle()
        .tokenizer()
        .encode("My favourite")
        .unwrap();
    let h = engine().handle();
    let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
    for batch in (0..DRAWS).collect::<Vec<_>>().chunks(32) {
        let gens: Vec<_> = batch
            .iter()
            .map(|&seed| {
                let req = GenerateRequest {
                    params: sampling(seed),
                    max_tokens: Some(2),
                    speculation,
                    ..GenerateRequest::new(Prompt::Tokens(prompt.clone()))
                };
                h.generate(req).unwrap()
            })
            .collect();
        for (g, seed) in gens.into_iter().zip(batch) {
            let out = g.collect_blocking().unwrap();
            assert_eq!(
                out.usage.draft_proposed, 1,
                "seed {seed}: a draft was checked at the first token"
            );
            *seen.entry(out.ids[0]).or_default() += 1;
        }
    }
    // The model's own distribution at that position.
    let model = Model::load(&model_path(), &Device::Cpu, Some(512)).unwrap();
    let logits = model.weights.forward(&prompt, &mut KvCache::new()).unwrap();
    let expected = nucleus(&logits);
    for t in seen.keys() {
        assert!(
            expected.iter().any(|e| e.0 == *t),
            "token {t} drawn outside top-p"
        );
    }
    // Cells of at least 5 expected draws; the rest of the nucleus pooled into one.
    let mut cells: Vec<(f64, usize)> = Vec::new();
    let mut rest = (0.0, 0);
    for &(t, p) in &expected {
        let e = p * DRAWS as f64;
        let o = seen.get(&t).copied().unwrap_or(0);
        if e >= 5.0 {
            cells.push((e, o));
        } else {
            rest.0 += e;
            rest.1 += o;
        }
    }
    if rest.0 > 0.0 {
        cells.push(rest);
    }
    let stat: f64 = cells.iter().map(|(e, o)| (*o as f64 - e).powi(2) / e).sum();
    let dof = cells.len() - 1;
    assert!(
        dof >= 10,
        "{dof} degrees of freedom: the test has too little to see"
    );
    let p = 1.0 - ChiSquared::new(dof as f64).unwrap().cdf(stat);
    println!("{speculation:?}: chi-square {stat:.1} with {dof} degrees of freedom, p = {p:.3}");
    p
}

#[test]
fn sampled_tokens_follow_the_models_distribution_with_an_always_right_draft() {
    let p = first_checked_token_p_value(Speculation::Draft);
    assert!(p > 0.01, "p = {p}");
}

#[test]
fn sampled_tokens_follow_the_models_distribution_with_an_always_wrong_draft() {
    let p = first_checked_token_p_value(Speculation::Contrary);
    assert!(p > 0.01, "p = {p}");
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_at_load() {
    // SmolLM2's vocabulary is not Qwen's.
    let Err(err) = Engine::start(EngineConfig {
        draft_model: Some(model_path()),
        ..EngineConfig::new(test_model("qwen3-test.Q8_0"))
    }) else {
        panic!("a draft of another vocabulary was loaded");
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::ModelFile { .. }), "{msg}");
    assert!(msg.contains("cannot draft for this model"), "{msg}");
}

#[test]
fn a_smaller_quantisation_drafts_for_the_same_model() {
    // Qwen3's test model at 4 bits drafting for its 8-bit file: a real pair of files.
    let engine = Engine::start(EngineConfig {
        draft_model: Some(test_model("qwen3-test.Q4_0")),
        weigh_speculation: false,
        ..EngineConfig::new(test_model("qwen3-test.Q8_0"))
    })
    .unwrap();
    let h = engine.handle();
    assert_eq!(h.draft_model().unwrap().quantization, "Q4_0");
    let req = |speculation| GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(48),
        speculation,
        ignore_eos: true,
        ..GenerateRequest::new(Prompt::Text("The quick brown fox".into()))
    };
    let (plain, fast) = plain_and_fast(&engine, req, Speculation::Draft);
    assert_eq!(fast.ids, plain.ids);
    assert!(fast.usage.draft_proposed > 0);

    // Without a draft model, an answer cannot ask for one; loading one back lets it.
    h.set_draft_model(None).unwrap();
    assert!(h.draft_model().is_none());
    let err = h.generate(req(Speculation::Draft)).err().expect("refused");
    assert!(err.to_string().contains("no draft model"), "{err}");
    let wrong = h.set_draft_model(Some(&model_path())).expect_err("refused");
    assert!(wrong.to_string().contains("cannot draft"), "{wrong}");
    assert!(h.draft_model().is_none());
    h.set_draft_model(Some(&test_model("qwen3-test.Q4_0")))
        .unwrap();
    let again = h
        .generate(req(Speculation::Draft))
        .unwrap()
        .collect_blocking();
    assert_eq!(again.unwrap().ids, plain.ids);
}

#[test]
fn a_draft_as_dear_as_the_model_is_weighed_and_mostly_paused() {
    // With the engine's weighing on (the default), SmolLM2 drafting for itself: each draft
    // token costs a pass as dear as the model's, so passes with drafts draw fewer tokens per
    // ms than plain ones, and the answer stops drafting (4, 16, 64 … steps). Unweighed, such
    // an answer proposes about one token per answer token; weighed, a few at the start.
    let engine = Engine::start(EngineConfig {
        draft_model: Some(model_path()),
        ..EngineConfig::new(model_path())
    })
    .unwrap();
    let req = |speculation| GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(120),
        speculation,
        ignore_eos: true,
        ..GenerateRequest::new(Prompt::Text("Count from 1 to 100: 1, 2, 3,".into()))
    };
    let (plain, weighed) = plain_and_fast(&engine, req, Speculation::Draft);
    assert_eq!(weighed.ids, plain.ids);
    let proposed = weighed.usage.draft_proposed;
    println!("weighed: {proposed} draft tokens proposed over 120");
    assert!(proposed > 0 && proposed < 40, "{proposed} proposed");
}
