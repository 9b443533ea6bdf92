//! Parity with llama.cpp on a test model (`tests/families.rs`, `tests/experts.rs`): llama.cpp's
//! logits recorded on the same file (`tests/fixtures/reference/`, by
//! `scripts/record-reference-logits.py`, tied to each file by its SHA-256), teacher-forced
//! and greedy.

use std::path::PathBuf;

use rill_engine::model::{KvCache, Model};
use serde_json::Value;
use sha2::Digest;

pub const NEAR_TIE: f32 = 0.1;

pub fn reference(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/reference/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A recorded list of numbers (logits, gaps, weights).
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The logits after each token of `tokens`, one step at a time.
pub fn teacher_forced(model: &Model, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = KvCache::new();
    tokens
        .iter()
        .map(|&t| model.weights.forward(&[t], &mut cache).unwrap())
        .collect()
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks one model against llama.cpp's recorded logits, with up to `flips` clear positions
/// or greedy steps allowed another top token (a known gap, named where it is used).
pub fn parity_but(name: &str, flips: usize) {
    let path = super::test_model(name);
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
        let theirs = floats(&p["logits"]);
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
                    "{name}: position {pos}: top token {} instead of llama.cpp's {} \
                     (its top two {:.3} apart)",
                    argmax(l),
                    top[0],
                    p["gap"].as_f64().unwrap()
                );
            }
        }
    }
    let nmse = err / energy;
    eprintln!("{name}: normalised MSE {nmse:.2e}; top token agrees at {agreed} of {checked} clear positions");
    assert!(nmse <= 1e-3, "{name}: normalised MSE {nmse}");
    let mut missed = checked - agreed;

    // Greedy after the prompt: llama.cpp's greedy path, step by step. Where its top two are
    // clear, our top token is its token; at a near-tie either is right, and the path goes on
    // with llama.cpp's (so the whole path is checked, not only up to the first near-tie).
    let prompt = &tokens[..r["prompt_tokens"].as_u64().unwrap() as usize];
    let mut cache = KvCache::new();
    let mut logits = model.weights.forward(prompt, &mut cache).unwrap();
    let want = ids(&r["greedy"]);
    let gaps = floats(&r["greedy_gaps"]);
    let (mut clear, mut first_tie) = (0, None);
    for (step, (&t, &gap)) in want.iter().zip(&gaps).enumerate() {
        if gap >= NEAR_TIE as f64 {
            if argmax(&logits) == t {
                clear += 1;
            } else {
                missed += 1;
                eprintln!(
                    "{name}: greedy step {step}: token {} instead of llama.cpp's {t} \
                     (its top two {gap:.3} apart)",
                    argmax(&logits)
                );
            }
        } else {
            first_tie.get_or_insert(step);
        }
        logits = model.weights.forward(&[t], &mut cache).unwrap();
    }
    eprintln!(
        "{name}: greedy: llama.cpp's token at {clear} clear steps of {} (first near-tie at {first_tie:?})",
        want.len()
    );
    assert!(
        missed <= flips,
        "{name}: another top token at {missed} positions or steps where llama.cpp's is clear"
    );
}
