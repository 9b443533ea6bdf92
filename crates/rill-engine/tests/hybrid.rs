//! Qwen3.5's recurrent state (issue 41): its Gated DeltaNet layers keep a state per sequence
//! instead of keys and values, which the cache copies at a few positions (`model/recurrent.rs`)
//! so that it can go back. On the qwen35 test model (`scripts/make-test-models.py`; its
//! parity with llama.cpp is `tests/families.rs`):
//! - the state carried over 400 single steps is one long prefill's;
//! - a cache cut back goes to a kept state, and runs on as if it had never gone further;
//! - in the flow, an answer paused and resumed, asked again (prefix reuse through the
//!   prompt's kept state), followed by a next turn, and speculated with drafts that are
//!   rejected (back to the state before the draft, the accepted tokens run again), is each
//!   time one plain run's greedy text;
//! - answers streaming together are their answers alone, the memory budget counts the states,
//!   and an answer evicted while paused is rebuilt exactly;
//! - crafted `ssm.*` sizes are named errors, and a multi-token-prediction block is skipped as
//!   llama.cpp skips it.

mod common;

use rill_engine::model::{KvCache, Model};
use rill_engine::{Engine, EngineConfig, Message, Speculation};

fn model() -> Model {
    load("qwen35-test.Q8_0")
}

fn load(name: &str) -> Model {
    Model::load(&common::test_model(name), &candle_core::Device::Cpu, None).unwrap()
}

/// `n` token ids of ordinary text (the parity test's), repeated as needed.
fn text_tokens(model: &Model, n: usize) -> Vec<u32> {
    let r = common::parity::reference("qwen35-test.Q8_0");
    let text = r["text"].as_str().unwrap();
    let ids = model.tokenizer.encode_with(text, false).unwrap();
    ids.iter().copied().cycle().take(n).collect()
}

/// Normalised squared difference of two logit vectors.
fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let (mut err, mut energy) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        err += (*x as f64 - *y as f64).powi(2);
        energy += (*y as f64).powi(2);
    }
    err / energy
}

#[test]
fn the_state_carried_over_400_single_steps_equals_one_prefill() {
    for name in ["qwen35-test.Q8_0", "qwen35moe-test.Q8_0"] {
        state_over_single_steps(&load(name));
    }
}

fn state_over_single_steps(model: &Model) {
    let tokens = text_tokens(model, 400);
    let mut whole = KvCache::new();
    let prefilled = model.weights.forward(&tokens, &mut whole).unwrap();
    let mut stepped = KvCache::new();
    let mut last = Vec::new();
    for &t in &tokens {
        last = model.weights.forward(&[t], &mut stepped).unwrap();
    }
    let d = nmse(&last, &prefilled);
    eprintln!("400 single steps against one prefill: normalised MSE {d:.2e}");
    assert!(d < 1e-6, "{d}");
    assert_eq!(
        common::parity::argmax(&last),
        common::parity::argmax(&prefilled)
    );
    // The states themselves: the next token's logits from either cache agree too.
    let next = tokens[7];
    let a = model.weights.forward(&[next], &mut whole).unwrap();
    let b = model.weights.forward(&[next], &mut stepped).unwrap();
    assert!(nmse(&a, &b) < 1e-6);
}

#[test]
fn a_cache_cut_back_goes_to_a_kept_state_and_runs_on_alike() {
    let model = model();
    let tokens = text_tokens(&model, 110);
    let mut cache = KvCache::new();
    // As a sequence asks for its prompt of 100 (`sequence.rs`): the states before its last
    // token and 8 before its end.
    cache.keep_states_at(&[99, 92]);
    model.weights.forward(&tokens[..60], &mut cache).unwrap();
    // A step of 40 keeps the state at 60 first.
    let at_100 = model.weights.forward(&tokens[60..100], &mut cache).unwrap();
    cache.checkpoint();
    for &t in &tokens[100..110] {
        model.weights.forward(&[t], &mut cache).unwrap();
    }
    assert_eq!(cache.len(), 110);
    // Only kept states are reachable: the prompt's (100), the ones asked for (99, 92), the one
    // before the last step (60).
    assert_eq!(cache.reachable(110), 110);
    assert_eq!(cache.reachable(105), 100);
    assert_eq!(cache.reachable(99), 99);
    assert_eq!(cache.reachable(98), 92);
    assert_eq!(cache.reachable(80), 60);
    assert_eq!(cache.reachable(59), 0);

    // Back to 100: the next token sees what it saw the first time.
    let mut copy = cache.copy_prefix(100).unwrap();
    assert_eq!(copy.len(), 100);
    let first = model.weights.forward(&[tokens[100]], &mut copy).unwrap();
    cache.truncate(100);
    assert_eq!(cache.len(), 100);
    let again = model.weights.forward(&[tokens[100]], &mut cache).unwrap();
    assert_eq!(first, again, "a copy and a cut cache hold the same state");

    // Asked for 80: it goes to 60, and the tokens after it give the same logits again.
    cache.truncate(80);
    assert_eq!(cache.len(), 60);
    let rerun = model.weights.forward(&tokens[60..100], &mut cache).unwrap();
    assert_eq!(rerun, at_100);

    // Before the first kept state: nothing is left, and a fresh start is a fresh start.
    cache.truncate(30);
    assert_eq!(cache.len(), 0);
    let fresh = model.weights.forward(&tokens[..60], &mut cache).unwrap();
    let mut new = KvCache::new();
    assert_eq!(
        fresh,
        model.weights.forward(&tokens[..60], &mut new).unwrap()
    );
    // The states and their copies are counted in the cache's memory.
    assert!(cache.bytes() > 0);
}

#[test]
fn recurrent_sizes_a_model_cannot_have_are_named_errors() {
    let path = common::test_model("qwen35-test.Q8_0");
    common::assert_header_errors(
        &path,
        &[
            // Value heads that are not a multiple of the key heads.
            ("qwen35.ssm.time_step_rank", 3, "Gated DeltaNet sizes"),
            // A state of 2^20 × 2^20 floats per head: refused, not allocated.
            ("qwen35.ssm.state_size", 1 << 20, "Gated DeltaNet sizes"),
            ("qwen35.ssm.conv_kernel", 0, "Gated DeltaNet sizes"),
            ("qwen35.full_attention_interval", 0, "interval of 0"),
            // More prediction layers than blocks.
            ("qwen35.block_count", 0, "no layers"),
        ],
    );
}

/// An engine on the qwen35 test model, checking every draft (no weighing: these tests are of
/// the text).
fn engine() -> Engine {
    engine_with(|c| c)
}

fn engine_with(change: impl FnOnce(EngineConfig) -> EngineConfig) -> Engine {
    let config = EngineConfig {
        weigh_speculation: false,
        ..EngineConfig::new(common::test_model("qwen35-test.Q8_0"))
    };
    Engine::start(change(config)).unwrap()
}

use common::flow::{greedy_40 as request, run};

#[test]
fn a_qwen35_answer_paused_asked_again_and_speculated_is_one_plain_run() {
    let e = engine();
    let ask = vec![Message::user(
        "Write a short poem about the sea and the ships.",
    )];
    let fresh = engine();
    let (plain, reused, _) = run(&fresh, request(ask.clone(), Speculation::Off));
    assert_eq!((plain.len(), reused), (40, 0));
    drop(fresh);

    // Paused after ten tokens, resumed: the same answer.
    let ids = common::flow::paused_and_resumed(&e, request(ask.clone(), Speculation::Off), 10);
    assert_eq!(ids, plain, "paused and resumed");

    // Asked again (a regenerated answer): the prompt comes from the kept state at its end.
    let (again, reused, _) = run(&e, request(ask.clone(), Speculation::Off));
    assert_eq!(again, plain, "asked again");
    assert!(reused > 0, "the prompt's state was reused");

    // Speculated: drafts that are always wrong go back to the state before them.
    let (contrary, _, (proposed, accepted)) = run(&e, request(ask.clone(), Speculation::Contrary));
    assert_eq!(contrary, plain, "with rejected drafts");
    assert!(proposed > 0 && accepted == 0, "{proposed} proposed");
    let (lookup, _, _) = run(&e, request(ask.clone(), Speculation::Lookup));
    assert_eq!(lookup, plain, "with prompt lookup");

    // A next turn reuses the conversation so far, and answers as a fresh engine would.
    let text = e
        .handle()
        .generate(request(ask.clone(), Speculation::Off))
        .unwrap()
        .collect_blocking()
        .unwrap()
        .text;
    let turn = vec![
        ask[0].clone(),
        Message::assistant(text),
        Message::user("Now one about the wind."),
    ];
    let (next, reused, _) = run(&e, request(turn.clone(), Speculation::Off));
    assert!(reused > 0, "the next turn reused the conversation");
    let (alone, _, _) = run(&engine(), request(turn, Speculation::Off));
    assert_eq!(next, alone, "a next turn");
}

#[test]
fn qwen35_answers_streaming_together_are_their_answers_alone() {
    // Each carries its own recurrent state; their rows go through the matrices as one batch.
    let asks = [
        "Write a short poem about the sea and the ships.",
        "Name three rivers of Europe.",
        "Count from one to twenty.",
    ];
    let e = engine();
    let alone: Vec<Vec<u32>> = asks
        .iter()
        .map(|a| run(&e, request(vec![Message::user(*a)], Speculation::Off)).0)
        .collect();
    let e = engine();
    let gens: Vec<_> = asks
        .iter()
        .map(|a| {
            e.handle()
                .generate(request(vec![Message::user(*a)], Speculation::Off))
                .unwrap()
        })
        .collect();
    let together: Vec<Vec<u32>> = gens
        .into_iter()
        .map(|g| g.collect_blocking().unwrap().ids)
        .collect();
    assert_eq!(together, alone);
}

#[test]
fn the_memory_budget_counts_states_and_an_evicted_answer_is_rebuilt_exactly() {
    // What a sequence may hold: its attention layer's keys and values, and its recurrent
    // states with every copy it may keep (`model/recurrent.rs`), whatever its length.
    let model = model();
    let (at_0, at_300) = (model.weights.kv_bytes(0), model.weights.kv_bytes(300));
    assert!(at_0 > 0, "the states are counted");
    assert_eq!(
        at_300 - at_0,
        300 * 2 * 2 * 64 * 2,
        "one attention layer's f16 K and V"
    );
    drop(model);

    let ask = vec![Message::user(
        "Write a short poem about the sea and the ships.",
    )];
    let (plain, _, _) = run(&engine(), request(ask.clone(), Speculation::Off));

    // Room for about one answer: a paused one gives its cache up for another, and is rebuilt
    // (its prompt and answer so far run again as a prefill) when resumed.
    let e = engine_with(|c| EngineConfig {
        kv_budget: Some(at_300),
        ..c
    });
    let h = e.handle();
    let mut paused = h.generate(request(ask.clone(), Speculation::Off)).unwrap();
    let mut ids = common::flow::take_tokens(&mut paused, 12);
    paused.pause().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let other = vec![Message::user("Name three rivers of Europe.")];
    h.generate(request(other, Speculation::Off))
        .unwrap()
        .collect_blocking()
        .unwrap();
    common::flow::wait_until("the paused cache to be evicted", || h.cache_bytes() == 0);
    paused.resume().unwrap();
    ids.extend(paused.collect_blocking().unwrap().ids);
    // A state rebuilt by one prefill is the state of the single steps (tested above, exactly):
    // the answer is the plain one, token for token.
    assert_eq!(ids, plain);
}

#[test]
fn a_multi_token_prediction_block_is_skipped_as_llama_cpp_skips_it() {
    // The same model with an MTP block after its four (`nextn_predict_layers = 1`): it loads,
    // agrees with llama.cpp's logits on that file, and answers as the plain file does.
    common::parity::parity_but("qwen35-mtp-test.Q8_0", 0);
    let (plain, mtp) = (model(), load("qwen35-mtp-test.Q8_0"));
    assert_eq!(mtp.weights.config().n_layer, 4);
    let tokens = text_tokens(&plain, 24);
    let logits = |m: &Model| m.weights.forward(&tokens, &mut KvCache::new()).unwrap();
    assert_eq!(logits(&mtp), logits(&plain));
}
