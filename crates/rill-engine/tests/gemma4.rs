//! Gemma 4's smaller models' block (issue 41) beyond what the parity test checks
//! (`tests/families.rs`: the gemma4e test model against llama.cpp's logits): on the gemma4e
//! test model (`scripts/make-test-models.py`: six layers, a global one every third, window 8,
//! per-layer embeddings, the last three layers reading layers 1 and 2's keys and values):
//! - which layer each reads, and the memory: the layers that read another's keep no rows;
//! - single steps over the sliding windows and the shared layers give one prefill's logits,
//!   bit for bit, and a cache cut back runs on as if it had never gone further;
//! - in the flow, an answer paused and resumed, asked again (prefix reuse) and speculated is
//!   each time one plain run's greedy text;
//! - header values that the block cannot have are named errors, of the 26B-A4B's mixture
//!   too (the gemma4moe test model).

mod common;

use rill_engine::model::{KvCache, Model};
use rill_engine::{Engine, EngineConfig, Message, Speculation};

const MODEL: &str = "gemma4e-test.Q8_0";

fn load() -> Model {
    Model::load(&common::test_model(MODEL), &candle_core::Device::Cpu, None).unwrap()
}

/// `n` token ids of ordinary text (the parity test's), repeated as needed.
fn text_tokens(model: &Model, n: usize) -> Vec<u32> {
    let r = common::parity::reference(MODEL);
    let text = r["text"].as_str().unwrap();
    let ids = model.tokenizer.encode_with(text, false).unwrap();
    ids.iter().copied().cycle().take(n).collect()
}

/// The logits after `tokens`, run as one step into a fresh cache.
fn one_shot(model: &Model, tokens: &[u32]) -> Vec<f32> {
    model.weights.forward(tokens, &mut KvCache::new()).unwrap()
}

#[test]
fn shared_layers_read_earlier_keys_and_keep_no_rows() {
    let model = load();
    let cfg = model.weights.config();
    // llama.cpp's choice: a windowed shared layer reads the layer two before the first shared
    // one, a global shared layer the one just before it.
    assert_eq!(cfg.kv_layer, vec![0, 1, 2, 1, 1, 2]);
    assert_eq!(cfg.per_layer_input, 32);
    let n = 300;
    let tokens = text_tokens(&model, n);
    let mut cache = KvCache::new();
    for (i, &t) in tokens.iter().enumerate() {
        let logits = model.weights.forward(&[t], &mut cache).unwrap();
        // One token at a time over sliding windows and shared layers: one prefill's bits.
        if [5, 8, 9, 150, n - 1].contains(&i) {
            assert!(
                logits == one_shot(&model, &tokens[..=i]),
                "position {i}: single steps changed the logits"
            );
        }
    }
    // What the three layers with keys of their own hold (f16 keys and values): the global
    // one every position in its doubling room, the two windowed ones their window and margins.
    // The shared layers would add as much again.
    let bytes = |i: usize| 2 * cfg.heads[i].kv_width() * 2;
    let most = bytes(2) * n.next_power_of_two()
        + 2 * bytes(0) * (8 + rill_engine::model::KV_ROLLBACK + 65);
    assert!(
        cache.bytes() <= most,
        "{} bytes, at most {most}",
        cache.bytes()
    );
    assert!(model.weights.kv_bytes(n) < 2 * most);
}

#[test]
fn a_cut_back_cache_runs_on_with_the_same_logits() {
    let model = load();
    let tokens = text_tokens(&model, 262);
    let mut cache = KvCache::new();
    model.weights.forward(&tokens[..200], &mut cache).unwrap();
    cache.checkpoint();
    for &t in &tokens[200..260] {
        model.weights.forward(&[t], &mut cache).unwrap();
    }
    // Back to the prompt (past the windows' live rows: through the checkpoint), then on.
    for to in [255, 200] {
        let mut copy = cache.copy_prefix(to).unwrap();
        let a = model
            .weights
            .forward(&tokens[to..to + 2], &mut copy)
            .unwrap();
        assert!(a == one_shot(&model, &tokens[..to + 2]), "copy cut to {to}");
        cache.truncate(to);
        assert_eq!(cache.len(), to);
        let b = model
            .weights
            .forward(&tokens[to..to + 2], &mut cache)
            .unwrap();
        assert!(b == a, "cache cut to {to}");
        cache.truncate(to);
    }
}

fn engine() -> Engine {
    Engine::start(EngineConfig::new(common::test_model(MODEL))).unwrap()
}

use common::flow::{greedy_40 as request, run};

#[test]
fn an_answer_paused_asked_again_and_speculated_is_one_plain_run() {
    let ask = vec![Message::user(
        "Write a short poem about the sea and the ships.",
    )];
    let (plain, reused, _) = run(&engine(), request(ask.clone(), Speculation::Off));
    assert_eq!((plain.len(), reused), (40, 0));

    let e = engine();
    let ids = common::flow::paused_and_resumed(&e, request(ask.clone(), Speculation::Off), 10);
    assert_eq!(ids, plain, "paused and resumed");

    let (again, reused, _) = run(&e, request(ask.clone(), Speculation::Off));
    assert_eq!(again, plain, "asked again");
    assert!(reused > 0, "the prompt was reused");
    for speculation in [Speculation::Contrary, Speculation::Lookup] {
        let (fast, _, _) = run(&e, request(ask.clone(), speculation));
        assert_eq!(fast, plain, "{speculation:?}");
    }
}

#[test]
fn header_values_the_block_cannot_have_are_named_errors() {
    let path = common::test_model(MODEL);
    common::assert_header_errors(
        &path,
        &[
            // Five of six layers shared: fewer than two keep their own.
            ("gemma4.attention.shared_kv_layers", 5, "at least two"),
            // Two shared: windowed layer 4 would read global layer 2.
            (
                "gemma4.attention.shared_kv_layers",
                2,
                "window or heads differ",
            ),
            // Per-layer embeddings of another width than the tensors'.
            (
                "gemma4.embedding_length_per_layer_input",
                16,
                "per_layer_token_embd",
            ),
            (
                "gemma4.embedding_length_per_layer_input",
                u32::MAX,
                "per_layer_token_embd",
            ),
        ],
    );
    // Gemma 4 26B-A4B's mixture: sizes its tensors do not have.
    common::assert_header_errors(
        &common::test_model("gemma4moe-test.Q8_0"),
        &[
            ("gemma4.expert_count", 4, "ffn_gate_inp"),
            ("gemma4.expert_used_count", 9, "experts of which 9 are used"),
            ("gemma4.expert_feed_forward_length", 64, "ffn_down_exps"),
        ],
    );
}
