//! Every storage type the engine promises to load, checked on real weights: the test model is
//! re-quantised into other GGUF types (as llama.cpp's `llama-quantize` would) and must still
//! load and answer. K-quants need rows that are a multiple of 256 wide; like llama.cpp, the
//! mixed file falls back to a 32-wide type for the 576-wide rows of this model.

use std::path::PathBuf;

mod common;
use common::model_path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use rill_engine::{Engine, EngineConfig, GenerateRequest, Prompt, SamplingParams};

/// Writes a copy of the test model with its 2-D weights stored as `pick(row_len)`.
fn requantize(dir: &std::path::Path, label: &str, pick: impl Fn(usize) -> GgmlDType) -> PathBuf {
    let src = model_path();
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let q = content.tensor(&mut f, name, &Device::Cpu).unwrap();
        let dims = q.shape().dims().to_vec();
        let t = if dims.len() == 2 {
            let w = q.dequantize(&Device::Cpu).unwrap();
            QTensor::quantize(&w, pick(dims[1])).unwrap()
        } else {
            q
        };
        tensors.push((name.clone(), t));
    }
    let out = dir.join(format!("smollm2-{label}.gguf"));
    let mut w = std::fs::File::create(&out).unwrap();
    let md: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut w, &md, &ts).unwrap();
    out
}

fn answer(path: &std::path::Path) -> (String, String) {
    let engine = Engine::start(EngineConfig::new(path)).unwrap();
    let h = engine.handle();
    // The assistant's answer already begun, so the next words are not a matter of style: a
    // re-quantised copy of a 135M model can prefer "I'm glad you asked…" to "The capital…" by
    // a hair (a near-tie that float order decides), but not something other than Paris here.
    let prompt = "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n\
                  <|im_start|>assistant\nThe capital of France is"
        .to_string();
    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(12),
        ..GenerateRequest::new(Prompt::Text(prompt))
    };
    (
        h.model_info().quantization.clone(),
        h.generate(req).unwrap().collect_blocking().unwrap().text,
    )
}

/// How a variant picks each tensor's storage type, given its number of columns.
type Pick = Box<dyn Fn(usize) -> GgmlDType>;

#[test]
fn f16_bf16_q8_0_q4_0_q5_1_and_k_quant_files_load_and_answer() {
    let dir = tempfile::tempdir().unwrap();
    let variants: Vec<(&str, Pick)> = vec![
        ("F16", Box::new(|_| GgmlDType::F16)),
        ("BF16", Box::new(|_| GgmlDType::BF16)),
        ("Q8_0", Box::new(|_| GgmlDType::Q8_0)),
        ("Q4_0", Box::new(|_| GgmlDType::Q4_0)),
        (
            "Q4K+Q5_0",
            Box::new(|row| {
                if row % 256 == 0 {
                    GgmlDType::Q4K
                } else {
                    GgmlDType::Q5_0
                }
            }),
        ),
        ("Q5_1", Box::new(|_| GgmlDType::Q5_1)),
        (
            "Q6K+Q8_0",
            Box::new(|row| {
                if row % 256 == 0 {
                    GgmlDType::Q6K
                } else {
                    GgmlDType::Q8_0
                }
            }),
        ),
    ];
    for (label, pick) in variants {
        let path = requantize(dir.path(), label, pick);
        let (quant, text) = answer(&path);
        eprintln!("{label}: {quant} → {text:?}");
        assert!(text.contains("Paris"), "{label}: {text}");
        std::fs::remove_file(path).unwrap();
    }
}
