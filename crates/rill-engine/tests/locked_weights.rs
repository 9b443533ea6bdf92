//! Weights locked in memory (`EngineConfig::lock_weights`, the CLI's `--mlock`;
//! `model/resident.rs`): on the qwen3 test model in Q4_K_M, whose matrices load read in the
//! file's map, the engine makes every panel, locks them (the process's locked memory grows by
//! at least the weights), answers as an engine without the option does, and releases the lock
//! when it stops. Where the system refuses (a small `ulimit -l` without the privilege to pass
//! it), the engine still runs, and says how much it locked.

mod common;

use common::flow::greedy;
use common::prompts::answer;
use rill_engine::{Engine, EngineConfig};

fn locked_now() -> usize {
    rill_engine::kernels::process_locked_bytes().expect("a /proc/self/status with VmLck")
}

#[test]
fn locked_weights_stay_in_memory_answer_the_same_and_are_released() {
    let path = common::test_model("qwen3-test.Q4_K_M");
    let question = "Write a short poem about the sea.";
    let plain = Engine::start(EngineConfig::new(&path)).unwrap();
    assert_eq!(plain.handle().locked_weight_bytes(), 0);
    let want = answer(&plain, greedy(question, 24));
    drop(plain);

    let before = locked_now();
    let engine = Engine::start(EngineConfig {
        lock_weights: true,
        ..EngineConfig::new(&path)
    })
    .unwrap();
    let h = engine.handle();
    // The panels were made before the lock: nothing is left to make.
    assert!(h.weights_ready());
    let (held, _) = h.step_weight_bytes();
    let locked = h.locked_weight_bytes();
    if locked >= held {
        assert!(
            locked_now() >= before + locked,
            "VmLck {} after locking {locked} bytes",
            locked_now()
        );
    } else {
        eprintln!("the system locked {locked} of {held} bytes here (ulimit -l)");
        assert!(locked_now() >= before + locked);
    }
    let got = answer(&engine, greedy(question, 24));
    assert_eq!(got.text, want.text);
    drop(engine);
    assert_eq!(locked_now(), before, "the lock outlived the engine");
}
