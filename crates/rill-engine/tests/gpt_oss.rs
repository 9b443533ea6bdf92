//! gpt-oss against llama.cpp (issue 18), on its test model (`scripts/make-test-models.py`:
//! q/k/v and output biases, a sink per head, 8 experts of which 2 are used, routed by a
//! softmax over the chosen with the router's bias, each a clamped SwiGLU with biases, every
//! other layer windowed, YaRN RoPE; the qwen2 vocabulary with harmony's tokens and the real
//! gpt-oss template), in its released form (experts in MXFP4, the rest Q8_0) and in F16, and
//! llama.cpp's logits and routes on the same files (`scripts/record-reference-logits.py`).
//! The router is checked in `tests/experts.rs` with the other mixtures'.

mod common;

use common::parity::parity_but;
use common::test_model;
use rill_engine::{
    Engine, EngineConfig, Event, GenerateRequest, Grammar, Message, SamplingParams, StopReason,
};

/// The formats of the test model: the released files' (MXFP4 experts, Q8_0 elsewhere), F16.
pub const GPT_OSS: &[&str] = &["gpt-oss-test.MXFP4", "gpt-oss-test.F16"];

/// Known gap of the F16 file: its last position (70, top two 0.356 apart) goes through
/// another expert in layer 0, where llama.cpp's router has two logits 0.00036 apart
/// (`tests/experts.rs`). The MXFP4 file has none.
const F16_TIE: usize = 1;

#[test]
fn gpt_oss_matches_llama_cpp() {
    parity_but(GPT_OSS[0], 0);
    parity_but(GPT_OSS[1], F16_TIE);
}

/// The MXFP4 experts are read where they lie in the memory-mapped file, not copied: the
/// model holds every byte of the file's `ffn_{gate,up,down}_exps` tensors in the map (the
/// parity test above runs on them), and none of the F16 file's, whose experts our kernels
/// read as they are too but from memory of our own.
#[test]
fn mxfp4_experts_stay_in_the_mapped_file() {
    use rill_engine::model::Model;
    for (name, mapped) in [(GPT_OSS[0], true), (GPT_OSS[1], false)] {
        let path = test_model(name);
        let experts = common::expert_bytes(&path);
        assert!(experts > 0);
        let model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
        let want = if mapped { experts } else { 0 };
        assert_eq!(model.weights.mapped_weight_bytes(), want, "{name}");
    }
}

/// One answer through the engine: its ids, its content and reasoning as the events carried
/// them, and why it ended.
struct Answer {
    ids: Vec<u32>,
    content: String,
    reasoning: String,
    reason: StopReason,
    reasoning_tokens: usize,
}

fn answer(engine: &Engine, req: GenerateRequest) -> Answer {
    let mut a = Answer {
        ids: Vec::new(),
        content: String::new(),
        reasoning: String::new(),
        reason: StopReason::Cancelled,
        reasoning_tokens: 0,
    };
    for ev in engine.handle().generate(req).unwrap() {
        match ev {
            Event::Token {
                id,
                text,
                reasoning,
                ..
            } => {
                a.ids.push(id);
                a.content.push_str(&text);
                a.reasoning.push_str(&reasoning);
            }
            Event::Done { reason, usage, .. } => {
                a.ids.truncate(usage.completion_tokens);
                a.reason = reason;
                a.reasoning_tokens = usage.reasoning_tokens;
            }
            _ => {}
        }
    }
    a
}

fn ask(budget: Option<usize>, max: usize) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(max),
        split_reasoning: true,
        thinking_budget: budget,
        ..GenerateRequest::chat(vec![Message::user("What is 17 times 3?")])
    }
}

/// The harmony markup a split answer must not show.
const MARKUP: &[&str] = &[
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "analysis",
];

/// Through the engine, with the real gpt-oss template: the answer's analysis message arrives
/// as reasoning and its final message as content, the markup in neither. (A random-weight
/// model writes no harmony of its own: with a thinking budget the engine opens the analysis,
/// as gpt-oss does first, and closes it after the budget; the final message follows.)
#[test]
fn harmony_channels_stream_as_reasoning_then_content() {
    let engine = Engine::start(EngineConfig::new(test_model(GPT_OSS[0]))).unwrap();
    let handle = engine.handle();
    let tok = handle.tokenizer();
    // The prompt is harmony's: it ends by starting the assistant's message.
    let prompt = handle.tokenize_prompt(&ask(None, 1).prompt).unwrap();
    let start = tok.encode_with("<|start|>assistant", false).unwrap();
    assert!(prompt.ends_with(&start), "{prompt:?}");
    let a = answer(&engine, ask(Some(8), 40));
    assert_eq!(a.reason, StopReason::Length);
    assert_eq!((a.ids.len(), a.reasoning_tokens), (40, 8));
    // The 8 thought tokens, then the analysis closed and the final message opened, then the
    // answer.
    let close = tok
        .encode_with(
            "<|end|><|start|>assistant<|channel|>final<|message|>",
            false,
        )
        .unwrap();
    assert_eq!(close.len(), 6, "four markers and two words: {close:?}");
    assert_eq!(&a.ids[8..8 + close.len()], &close[..]);
    assert_eq!(a.reasoning, tok.decode(&a.ids[..8]));
    assert_eq!(a.content, tok.decode(&a.ids[8 + close.len()..]));
    assert!(!a.reasoning.is_empty() && !a.content.is_empty());
    for m in MARKUP {
        assert!(
            !a.reasoning.contains(m) && !a.content.contains(m),
            "{m} in {:?} / {:?}",
            a.reasoning,
            a.content
        );
    }
    // `<|end|>` ends a message, not the answer; `<|return|>` and `<|call|>` end answers.
    let id = |t: &str| tok.encode_with(t, false).unwrap()[0];
    assert!(!tok.is_eog(id("<|end|>")));
    assert!(tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")));
}

/// A JSON schema on gpt-oss shapes its final message, not its analysis: the grammar waits
/// through the analysis and the headers, and the content is JSON the schema accepts.
#[test]
fn a_grammar_shapes_the_final_message() {
    let engine = Engine::start(EngineConfig::new(test_model(GPT_OSS[0]))).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": false
    });
    let a = answer(
        &engine,
        GenerateRequest {
            grammar: Some(Grammar::JsonSchema(schema)),
            ..ask(Some(6), 60)
        },
    );
    assert_eq!(a.reasoning_tokens, 6);
    assert!(!a.reasoning.is_empty());
    let v: serde_json::Value = serde_json::from_str(&a.content)
        .unwrap_or_else(|e| panic!("{e}: {:?} (reasoning {:?})", a.content, a.reasoning));
    assert!(v["answer"].is_i64(), "{v}");
    assert_eq!(a.reason, StopReason::Stop);
}

/// candle's path (what runs on a GPU) has no sinks or MXFP4: loading gpt-oss there is refused
/// with the reason, not run wrong.
#[test]
fn gpt_oss_on_candles_path_is_refused_with_the_reason() {
    use rill_engine::model::{Compute, Model};
    let path = test_model(GPT_OSS[0]);
    let msg = match Model::load_with(&path, &candle_core::Device::Cpu, None, Compute::Candle) {
        Ok(_) => panic!("gpt-oss loaded on candle's path"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("gpt-oss") && msg.contains("CPU only"), "{msg}");
}
