//! Fixtures shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use rill_engine::{Engine, EngineConfig, GenerateRequest, Prompt, SamplingParams};

pub mod flow;
pub mod images;
pub mod parity;
pub mod prompts;

/// `$var`, else `default` under the repository's root.
fn in_repo(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(default)
    })
}

/// `p`, which must be a file; else `fix` says how to make it.
fn test_file(p: PathBuf, fix: &str) -> PathBuf {
    assert!(p.is_file(), "test model missing at {}: {fix}", p.display());
    p
}

/// The real test model (fetched by `scripts/fetch-test-model.sh`), or `RILL_TEST_MODEL`.
pub fn model_path() -> PathBuf {
    test_file(
        in_repo("RILL_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "run scripts/fetch-test-model.sh",
    )
}

/// A family's test model (`scripts/make-test-models.py`, which `make test` runs), such as
/// `gemma3-test.Q8_0`, from `models/test-models` or `RILL_TEST_MODELS`.
pub fn test_model(name: &str) -> PathBuf {
    test_file(
        in_repo("RILL_TEST_MODELS", "models/test-models").join(format!("{name}.gguf")),
        "run `python3 scripts/make-test-models.py`",
    )
}

/// Bytes of a file's mixture-of-experts weights (its `*_exps` tensors), from its header.
#[allow(dead_code)] // Only the mixtures' tests use it.
pub fn expert_bytes(path: &std::path::Path) -> usize {
    use rill_engine::model::gguf;
    let mut file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    let header = gguf::read(&mut file, len).unwrap();
    header
        .tensor_infos
        .iter()
        .filter(|(n, _)| n.ends_with("_exps.weight"))
        .map(|(_, t)| {
            // GGUF's order: the innermost dimension first.
            let dims: Vec<usize> = t.shape.dims().iter().rev().copied().collect();
            gguf::tensor_bytes(&dims, t.dtype).unwrap() as usize
        })
        .sum()
}

/// The golden reference file from llama.cpp, or `RILL_GOLDEN`.
pub fn golden_path() -> PathBuf {
    std::env::var_os("RILL_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/golden/smollm2-q4_1-llama.cpp.json")
        })
}

/// llama.cpp's reference cases on the real model ([`golden_path`]).
#[derive(serde::Deserialize)]
pub struct Golden {
    pub cases: Vec<GoldenCase>,
}

#[derive(serde::Deserialize)]
pub struct GoldenCase {
    pub name: String,
    pub messages: Vec<rill_engine::Message>,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub completion_text: String,
    pub stopped_at_eos: bool,
}

pub fn golden() -> Golden {
    let path = golden_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden file parses")
}

/// The index of the largest logit (the last of equals, as `Iterator::max_by` picks).
pub fn argmax(logits: &[f32]) -> usize {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap_or(0)
}

/// Largest logit gap still called a near-tie: a choice that batched and step-by-step float
/// arithmetic (ours, or llama.cpp's) can make either way. Logits here run to ±30.
pub const NEAR_TIE: f32 = 0.2;

/// Asserts that `rest` is the greedy continuation of `context`, token by token, up to
/// near-ties, by running the model directly.
pub fn assert_greedy_continuation(context: &[u32], rest: &[u32]) {
    let model =
        rill_engine::model::Model::load(&model_path(), &candle_core::Device::Cpu, None).unwrap();
    let mut cache = rill_engine::model::KvCache::new();
    let mut logits = model.weights.forward(context, &mut cache).unwrap();
    for (i, &t) in rest.iter().enumerate() {
        let best = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let gap = best - logits[t as usize];
        assert!(
            gap < NEAR_TIE,
            "token {i} of the continuation is {gap} below the most likely one: not greedy"
        );
        logits = model.weights.forward(&[t], &mut cache).unwrap();
    }
}

/// How far `token` is below the most likely next token after `context` + `prefix` (0 when it is
/// the most likely), running the model directly.
pub fn greedy_gap(context: &[u32], prefix: &[u32], token: u32) -> f32 {
    let model =
        rill_engine::model::Model::load(&model_path(), &candle_core::Device::Cpu, None).unwrap();
    let mut cache = rill_engine::model::KvCache::new();
    let all: Vec<u32> = context.iter().chain(prefix).copied().collect();
    let logits = model.weights.forward(&all, &mut cache).unwrap();
    let best = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    best - logits[token as usize]
}

/// llama.cpp's `models/` folder (its tokenizer test vocabularies and chat templates):
/// `RILL_LLAMA_CPP_MODELS`, else the cache `scripts/fetch-llama-cpp-assets.sh` fills.
pub fn llama_cpp_assets() -> PathBuf {
    if let Some(p) = std::env::var_os("RILL_LLAMA_CPP_MODELS") {
        return PathBuf::from(p);
    }
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-llama-cpp-assets.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "llama.cpp's test assets are missing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

pub mod gguf_craft;

/// One engine on the real model for the whole test file: its tests run side by side on it, as
/// chats do in the app.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::start(EngineConfig::new(model_path())).expect("the test model loads")
    })
}

/// A greedy request for `prompt`, at most `max_tokens` answered.
pub fn greedy(prompt: Prompt, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(max_tokens),
        ..GenerateRequest::new(prompt)
    }
}

/// Asserts that the file at `path`, with each metadata key's u32 value set as listed, is
/// refused by [`rill_engine::model::check`] with an error that contains the listed words.
pub fn assert_header_errors(path: &std::path::Path, cases: &[(&str, u32, &str)]) {
    let bytes = std::fs::read(path).unwrap();
    for &(key, value, says) in cases {
        let at = bytes
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .expect("the key is in the header");
        // The key, then its value's type (u32), then the value.
        let v = at + key.len() + 4;
        let mut crafted = bytes.clone();
        crafted[v..v + 4].copy_from_slice(&value.to_le_bytes());
        let mut reader = std::io::Cursor::new(&crafted);
        let err = rill_engine::model::check(&mut reader, crafted.len() as u64, path)
            .expect_err(key)
            .to_string();
        assert!(err.contains(says), "{key} = {value}: {err}");
    }
}
