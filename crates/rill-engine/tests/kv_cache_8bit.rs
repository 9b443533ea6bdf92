//! The 8-bit KV cache (`--kv-cache q8_0`, issue 15): on the real SmolLM2 model its greedy
//! choices stay those of llama.cpp's f16 reference up to its rounding's near-ties, its logits
//! stay close to the f16 cache's (a normalised MSE of 9e-3), it takes 53% of the f16 cache's
//! memory, a prompt gives the same logits in any chunks, a sliding-window layer (the Gemma 3
//! test model) keeps its window in 8 bits, the engine streams with it, and a path that cannot
//! hold it refuses it clearly.

mod common;

use common::{argmax, golden, model_path};
use rill_engine::model::{Compute, KvCache, KvType, Model};
use rill_engine::{Engine, EngineConfig, Event, GenerateRequest, Message, Prompt, SamplingParams};

/// A choice the 8-bit cache may make otherwise than llama.cpp's f16 reference: within a logit
/// gap of 0.4 (logits run to ±30). Its rounding (up to half a step of 1/127 of a block's
/// largest key or value) moves the logits by more than float order does
/// ([`common::NEAR_TIE`], 0.2): measured, 10 of the golden cases' 224 steps flip, at gaps of
/// 0.01–0.30.
const NEAR_TIE_8BIT: f32 = 0.4;

fn load(kind: KvType) -> Model {
    let mut model = Model::load(&model_path(), &candle_core::Device::Cpu, None).unwrap();
    model.weights.set_kv_type(kind).unwrap();
    model
}

#[test]
fn an_8bit_cache_follows_llama_cpp_and_the_f16_cache() {
    let (q8, f16) = (load(KvType::Q8_0), load(KvType::F16));
    let (mut steps, mut agree) = (0, 0);
    let (mut err, mut power) = (0f64, 0f64);
    for case in golden().cases {
        let (mut c8, mut c16) = (KvCache::new(), KvCache::new());
        let mut l8 = q8.weights.forward(&case.prompt_ids, &mut c8).unwrap();
        let mut l16 = f16.weights.forward(&case.prompt_ids, &mut c16).unwrap();
        for (i, &theirs) in case.completion_ids.iter().enumerate() {
            let mean = l16.iter().map(|&v| v as f64).sum::<f64>() / l16.len() as f64;
            for (a, b) in l8.iter().zip(&l16) {
                err += (*a as f64 - *b as f64).powi(2);
                power += (*b as f64 - mean).powi(2);
            }
            let ours = argmax(&l8);
            steps += 1;
            if ours as u32 == theirs {
                agree += 1;
            } else {
                let gap = l8[ours] - l8[theirs as usize];
                eprintln!(
                    "{} step {i}: ours {ours} vs llama.cpp {theirs}, gap {gap:.3}",
                    case.name
                );
                assert!(
                    gap < NEAR_TIE_8BIT,
                    "{} step {i}: the 8-bit cache chose otherwise by {gap}",
                    case.name
                );
            }
            l8 = q8.weights.forward(&[theirs], &mut c8).unwrap();
            l16 = f16.weights.forward(&[theirs], &mut c16).unwrap();
        }
        // Keys and values in 8 bits: about half the f16 cache's bytes (34 for 64).
        let ratio = c8.bytes() as f64 / c16.bytes() as f64;
        assert!((0.52..0.54).contains(&ratio), "{}: {ratio}", case.name);
    }
    let nmse = err / power;
    eprintln!("8-bit cache: {agree}/{steps} steps agree with llama.cpp; nMSE to f16 {nmse:.2e}");
    assert!(agree * 100 >= steps * 95, "{agree}/{steps}");
    // Measured 9.1e-3: SmolLM2's three KV heads carry a few large channels, which set their
    // blocks' scales.
    assert!(nmse < 2e-2, "normalised MSE to the f16 cache: {nmse}");
    // The budget counts the 8-bit bytes.
    let ratio = q8.weights.kv_bytes(4096) as f64 / f16.weights.kv_bytes(4096) as f64;
    assert!((ratio - 34.0 / 64.0).abs() < 1e-9, "{ratio}");
}

#[test]
fn an_8bit_cache_gives_the_same_logits_in_any_chunks() {
    let model = load(KvType::Q8_0);
    let prompt = golden().cases[0].prompt_ids.clone();
    let run = |chunk: usize| {
        let mut cache = KvCache::new();
        let mut logits = Vec::new();
        for c in prompt.chunks(chunk) {
            logits = model.weights.forward(c, &mut cache).unwrap();
        }
        logits.extend(model.weights.forward(&[28], &mut cache).unwrap());
        logits
    };
    let whole = run(prompt.len());
    for chunk in [1, 7] {
        assert!(run(chunk) == whole, "chunks of {chunk} change the logits");
    }
}

#[test]
fn a_windowed_layer_slides_in_8_bits() {
    // Gemma 3's test model: five layers of window 8 and a global one. One token at a time over
    // the sliding 8-bit cache gives the bits of one step over a fresh one, which drops nothing.
    let path = common::test_model("gemma3-test.Q8_0");
    let mut model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
    model.weights.set_kv_type(KvType::Q8_0).unwrap();
    let words = "the river boats of Europe carried salt, wine and stone between towns ";
    let mut tokens = Vec::new();
    while tokens.len() < 200 {
        tokens.extend(model.tokenizer.encode_with(words, false).unwrap());
    }
    let mut cache = KvCache::new();
    for (i, &t) in tokens[..200].iter().enumerate() {
        let logits = model.weights.forward(&[t], &mut cache).unwrap();
        if [9, 120, 199].contains(&i) {
            let fresh = model
                .weights
                .forward(&tokens[..=i], &mut KvCache::new())
                .unwrap();
            assert!(
                logits == fresh,
                "position {i}: the sliding 8-bit cache differs"
            );
        }
    }
}

#[test]
fn the_engine_streams_with_an_8bit_cache() {
    let engine = Engine::start(EngineConfig {
        kv_cache: KvType::Q8_0,
        ..EngineConfig::new(model_path())
    })
    .unwrap();
    let request = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(32),
        ..GenerateRequest::new(Prompt::Messages(vec![Message::user(
            "What is the capital of France? Answer in one word.",
        )]))
    };
    let (mut text, mut tokens, mut done) = (String::new(), 0, false);
    for event in engine.handle().generate(request).unwrap() {
        match event {
            Event::Token { text: t, .. } => {
                text.push_str(&t);
                tokens += 1;
            }
            Event::Done { .. } => done = true,
            _ => {}
        }
    }
    assert!(done && tokens >= 2, "{tokens} tokens: {text}");
    assert!(text.contains("Paris"), "{text}");
}

#[test]
fn a_path_that_cannot_hold_8_bits_refuses_them() {
    // candle's forward pass keeps its cache in f32 tensors.
    let mut candle = Model::load_with(
        &model_path(),
        &candle_core::Device::Cpu,
        None,
        Compute::Candle,
    )
    .unwrap();
    let e = candle.weights.set_kv_type(KvType::Q8_0).unwrap_err();
    assert!(e.to_string().contains("CPU only"), "{e}");
    assert_eq!(candle.weights.kv_type(), KvType::F16);
    assert!(KvType::parse("q4_0")
        .unwrap_err()
        .to_string()
        .contains("f16 or q8_0"));
}
