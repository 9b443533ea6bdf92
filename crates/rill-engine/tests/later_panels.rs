//! K-quant models load with their matrices read in the file's memory map, their panels made
//! later (`kernels/later.rs`): on the qwen3 test model in Q4_K_M and Q5_K_M, the logits of every
//! position, one step at a time, are the same bits on the file's rows and on the panels, and a
//! prompt's chunk gives its last position's; an idle engine makes the panels and says so.

mod common;

use common::parity::{ids, reference, teacher_forced};
use rill_engine::model::{KvCache, Model};
use rill_engine::{Engine, EngineConfig};

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn logits_are_the_same_bits_before_and_after_the_panels_are_made() {
    for name in ["qwen3-test.Q4_K_M", "qwen3-test.Q5_K_M"] {
        let path = common::test_model(name);
        let mut model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
        let tokens = ids(&reference(name)["tokens"]);
        let tokens = &tokens[..24];
        // Where this CPU runs the K-quants' panels (AVX2 and up), every matrix starts in the
        // map.
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::env::var_os("RILL_PANELS_AT_LOAD").is_none()
        {
            assert!(model.weights.panels_pending(), "{name}");
        }
        // One position at a time: rows of one, on the file's rows.
        let before = teacher_forced(&model, tokens);
        // The whole prompt as one chunk of 24 rows, still on the file's rows (a long prompt's
        // chunk would make the panels first).
        let chunk = model.weights.forward(tokens, &mut KvCache::new()).unwrap();
        // What the idle engine does: the rest.
        while model.weights.make_next_panels() {}
        assert!(!model.weights.panels_pending(), "{name}");
        let after = teacher_forced(&model, tokens);
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            assert!(
                same_bits(b, a),
                "{name}: position {i} differs on the panels"
            );
        }
        assert!(
            same_bits(&chunk, &after[tokens.len() - 1]),
            "{name}: the chunk's last position"
        );
    }
}

#[test]
fn an_idle_engine_makes_the_panels_and_says_so() {
    let engine = Engine::start(EngineConfig::new(common::test_model("qwen3-test.Q4_K_M"))).unwrap();
    let h = engine.handle();
    common::flow::wait_until("the panels to be made", || h.weights_ready());
}
