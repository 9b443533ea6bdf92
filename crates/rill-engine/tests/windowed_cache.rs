//! The KV cache of a sliding-window layer keeps only what its window still sees (issue 14),
//! on the Gemma 3 test model (five windowed layers of window 8, one global layer): the
//! logits stay those of a cache that keeps everything, the memory stops growing on the
//! windowed layers, and cutting the cache back (prefix reuse) goes as far as its rows and
//! its checkpoint reach, in the model and through the engine.

mod common;

use common::argmax;

use rill_engine::model::{Compute, KvCache, Model, KV_ROLLBACK};
use rill_engine::{Engine, EngineConfig, Event, GenerateRequest, Message, SamplingParams};

const MODEL: &str = "gemma3-test.Q8_0";

fn load() -> Model {
    Model::load(&common::test_model(MODEL), &candle_core::Device::Cpu, None).unwrap()
}

/// `n` token ids of ordinary text.
fn text_tokens(model: &Model, n: usize) -> Vec<u32> {
    let words = "the river boats of Europe carried salt, wine and stone between towns that \
                 grew along their banks; each lock and bridge changed how far a cargo went ";
    let mut ids = Vec::new();
    while ids.len() < n {
        ids.extend(model.tokenizer.encode_with(words, false).unwrap());
    }
    ids.truncate(n);
    ids
}

/// The logits after `tokens`, run as one step into a fresh cache (which drops nothing: a
/// window slides before a step, never inside one).
fn one_shot(model: &Model, tokens: &[u32]) -> Vec<f32> {
    model.weights.forward(tokens, &mut KvCache::new()).unwrap()
}

/// The window of the model's windowed layers (they share one).
fn window(model: &Model) -> usize {
    let windows = &model.weights.config().windows;
    assert!(windows.iter().any(Option::is_none), "a global layer");
    windows
        .iter()
        .flatten()
        .copied()
        .max()
        .expect("windowed layers")
}

#[test]
fn a_windowed_layer_keeps_its_window_and_the_logits_do_not_change() {
    let model = load();
    let cfg = model.weights.config();
    let w = window(&model);
    let n = 400;
    let tokens = text_tokens(&model, n);
    let mut cache = KvCache::new();
    for (i, &t) in tokens.iter().enumerate() {
        let logits = model.weights.forward(&[t], &mut cache).unwrap();
        // Rows independent of their step (our kernels' promise): one token at a time over a
        // sliding cache gives the bits of one step over a cache that holds every position.
        if [w, 150, 260, n - 1].contains(&i) {
            assert!(
                logits == one_shot(&model, &tokens[..=i]),
                "position {i}: the sliding cache changed the logits"
            );
        }
    }
    // The global layer holds every position (in its doubling room); each windowed layer at
    // most its window, the rollback, a quarter-window slack (64 at least) and the step's row.
    let per_position = 2 * cfg.n_kv_head * cfg.head_dim * 2;
    let global = cfg.windows.iter().filter(|w| w.is_none()).count();
    let windowed = cfg.n_layer - global;
    let most = global * n.next_power_of_two() + windowed * (w + KV_ROLLBACK + 64 + 1);
    assert!(
        cache.bytes() <= most * per_position,
        "{} bytes for {n} positions; at most {} expected",
        cache.bytes(),
        most * per_position
    );
    assert!(cache.bytes() * 2 < cfg.n_layer * n * per_position);
}

/// candle's path (the GPU's; here on candle's CPU device) slides its tensors the same way:
/// its logits over a sliding cache are those of one step over the whole text.
#[test]
fn the_candle_path_slides_its_windows_too() {
    let path = common::test_model(MODEL);
    let model = Model::load_with(&path, &candle_core::Device::Cpu, None, Compute::Candle).unwrap();
    let cfg = model.weights.config();
    let w = window(&model);
    let n = 300;
    let tokens = text_tokens(&model, n);
    let mut cache = KvCache::new();
    let mut last = Vec::new();
    for &t in &tokens {
        last = model.weights.forward(&[t], &mut cache).unwrap();
    }
    // candle's kernels round a row by its batch's shape, so compare closely, not bit for bit.
    let whole = one_shot(&model, &tokens);
    let (err, energy) = last
        .iter()
        .zip(&whole)
        .fold((0f64, 0f64), |(e, s), (a, b)| {
            (e + (*a as f64 - *b as f64).powi(2), s + (*b as f64).powi(2))
        });
    assert!(err / energy < 1e-8, "normalised MSE {:.2e}", err / energy);
    let mut sorted = whole.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    assert!(sorted[0] - sorted[1] < 1e-3 || argmax(&last) == argmax(&whole));
    // f32 tensors: the global layer's doubling room, the windowed layers' window and margins.
    let per_position = 2 * cfg.n_kv_head * cfg.head_dim * 4;
    let global = cfg.windows.iter().filter(|w| w.is_none()).count();
    let most = global * n.next_power_of_two() + (cfg.n_layer - global) * (w + KV_ROLLBACK + 65);
    assert!(
        cache.bytes() <= most * per_position,
        "{} bytes",
        cache.bytes()
    );
}

#[test]
fn a_cut_back_goes_as_far_as_the_rows_and_the_checkpoint_reach() {
    let model = load();
    let w = window(&model);
    let (prompt, n) = (200, 400);
    let tokens = text_tokens(&model, n + 2);
    let mut cache = KvCache::new();
    model
        .weights
        .forward(&tokens[..prompt], &mut cache)
        .unwrap();
    cache.checkpoint();
    for &t in &tokens[prompt..n] {
        model.weights.forward(&[t], &mut cache).unwrap();
    }
    // Within the rollback, the live rows; past it, back to the checkpoint (as far back as its
    // own rows reach); before that, nothing.
    let checkpoint_from = prompt + 1 - w - KV_ROLLBACK;
    assert_eq!(cache.reachable(n - KV_ROLLBACK), n - KV_ROLLBACK);
    assert_eq!(cache.reachable(n - KV_ROLLBACK - 80), prompt);
    assert_eq!(cache.reachable(prompt - 1), prompt - 1);
    let first = checkpoint_from + w - 1;
    assert_eq!(cache.reachable(first), first);
    assert_eq!(cache.reachable(first - 1), 0);

    // Every cut gives the logits of a cache that never dropped a row: a copy of the prefix
    // (a preview's), and the cache itself cut back (from the longest cut to the shortest).
    let check = |c: &mut KvCache, to: usize| {
        assert_eq!(c.len(), to);
        let logits = model.weights.forward(&tokens[to..to + 2], c).unwrap();
        assert!(
            logits == one_shot(&model, &tokens[..to + 2]),
            "cut back to {to}: the logits changed"
        );
    };
    for to in [n - 10, prompt - 1, first] {
        check(&mut cache.copy_prefix(to).unwrap(), to);
        cache.truncate(to);
        check(&mut cache, to);
    }
    // Cut to nothing, the cache starts again.
    cache.truncate(first - 1);
    assert_eq!(cache.len(), 0);
    let logits = model.weights.forward(&tokens[..3], &mut cache).unwrap();
    assert!(logits == one_shot(&model, &tokens[..3]));
}

#[test]
fn a_regenerated_long_answer_reuses_its_prompt() {
    let e = Engine::start(EngineConfig::new(common::test_model(MODEL))).unwrap();
    let h = e.handle();
    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(200),
        ignore_eos: true,
        ..GenerateRequest::chat(vec![Message::user(
            "Tell me about the river boats of Europe.",
        )])
    };
    let started = |req: GenerateRequest| {
        let mut gen = h.generate(req).unwrap();
        let mut started = None;
        while let Some(ev) = gen.blocking_next() {
            match ev {
                Event::Started {
                    prompt_tokens,
                    reused_tokens,
                    ..
                } => started = Some((prompt_tokens, reused_tokens)),
                Event::Error { message } => panic!("{message}"),
                _ => {}
            }
        }
        started.unwrap()
    };
    let (prompt, reused) = started(req.clone());
    assert_eq!(reused, 0);
    // The answer (200 tokens) ran far past the windowed layers' rows, yet the same prompt
    // again reuses all of it but its last token (whose logits the answer needs).
    let t = std::time::Instant::now();
    while h.prefix_cache_bytes() == 0 {
        assert!(
            t.elapsed().as_secs() < 60,
            "the answer's cache was not kept"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (again, reused) = started(req);
    assert_eq!(again, prompt);
    assert_eq!(reused, prompt - 1);
}
