//! `rill bench` as a user runs it, on the real SmolLM2 model: every figure in its JSON (the
//! bandwidth and compute bounds included), several streams, a background answer, a depth and
//! turns, and a clear error for a depth beside several streams.

mod common;

use common::{assert_clean_error, model, ok, rill};

/// Taken by each test for its whole run: the tests time real answers, and each `rill bench`
/// ends by driving both cores flat out for a moment (its bandwidth and byte-product probes),
/// which, run beside the other test, held one of two streams' prompts back until the other
/// stream had finished (`together_tps` 0).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`ONE_AT_A_TIME`], also after a test that held it failed.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn bench_reports_every_figure_as_json() {
    let _alone = alone();
    let m = model();
    let out = ok(rill().args([
        "bench",
        "--model",
        m.to_str().unwrap(),
        "--prompt-tokens",
        "64",
        "--gen-tokens",
        "8",
        "--json",
    ]));
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["streams"], 1);
    assert_eq!(r["prompt_tokens"], 64);
    assert_eq!(r["gen_tokens"], 8);
    for key in ["prefill_tps", "decode_tps", "peak_rss_mb"] {
        assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {r}");
    }
    for key in ["ttft_ms", "itl_ms"] {
        let (p50, p95) = (
            r[key]["p50"].as_f64().unwrap(),
            r[key]["p95"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p95 >= p50, "{key}: {r}");
    }
    // The bandwidth bound: the machine's read speed over the weights a step reads (as the
    // file stores them; held, at least as many).
    let f = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("{key}: {r}"));
    assert!(f("read_gbps") > 0.1 && f("step_file_mb") > 1.0, "{r}");
    assert!(f("step_weight_mb") >= f("step_file_mb"), "{r}");
    let bound = f("read_gbps") * 1e3 / f("step_file_mb");
    assert!((f("decode_bound_tps") - bound).abs() < 1e-6 * bound, "{r}");
    let of = f("decode_tps") / bound;
    assert!((f("decode_of_bound") - of).abs() < 1e-9 && of > 0.0, "{r}");
    // The compute bound: the CPU's byte products over the layers' multiply-adds a prompt row
    // takes. SmolLM2-135M: 30 layers of q, k, v (576 → 576 + 2 × 192), o (576 × 576) and the
    // gated MLP (3 × 576 × 1,536).
    if cfg!(target_arch = "x86_64") {
        let row = 30.0 * (576.0 * 960.0 + 576.0 * 576.0 + 3.0 * 576.0 * 1536.0) / 1e6;
        assert!((f("prompt_row_mmacs") - row).abs() < 1e-9, "{r}");
        assert!(f("byte_gmacs") > 1.0, "{r}");
        let bound = f("byte_gmacs") * 1e3 / row;
        assert!((f("prefill_bound_tps") - bound).abs() < 1e-6 * bound, "{r}");
        let of = f("prefill_tps") / bound;
        assert!((f("prefill_of_bound") - of).abs() < 1e-9 && of > 0.0, "{r}");
    }
}

#[test]
fn bench_measures_several_streams_background_load_and_turns() {
    let _alone = alone();
    let m = model();
    let m = m.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["bench", "--model", m, "--json"];
        all.extend_from_slice(args);
        serde_json::from_str(ok(rill().args(&all)).trim()).unwrap()
    };
    let r = json(&[
        "--streams",
        "2",
        "--prompt-tokens",
        "32",
        "--gen-tokens",
        "32",
    ]);
    assert_eq!(r["streams"], 2);
    let per = r["per_stream_decode_tps"].as_array().unwrap();
    assert_eq!(per.len(), 2);
    let sum: f64 = per.iter().map(|v| v.as_f64().unwrap()).sum();
    assert!(
        (r["decode_tps"].as_f64().unwrap() - sum).abs() < 1e-6,
        "decode_tps is the sum over streams"
    );
    // Both streams decode side by side for most of their 32 tokens (with 8, a loaded CI
    // machine once let the first finish before the second's prompt was in): the window in
    // which both were decoding holds tokens.
    assert!(r["together_tps"].as_f64().unwrap() > 0.0, "{r}");

    let r = json(&[
        "--background",
        "1",
        "--prompt-tokens",
        "1024",
        "--gen-tokens",
        "4",
    ]);
    assert_eq!(r["background"], 1);
    assert!(r["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    // The background answer's gaps while the prompt went in and after. The prompt's first 16
    // tokens are the warm-up's (reused); the other 1,008 go in over several rounds beside the
    // background answer (a round may add a fraction of a decode step), each giving it a token.
    // (A prompt the pacer judges short, at most 150 ms of work, goes in at once instead and
    // leaves no gap to measure: 48 tokens sometimes did, so this one is far longer.)
    let gap = |k: &str| r[k]["p50"].as_f64().unwrap();
    assert!(gap("background_itl_prefill_ms") > 0.0, "{r}");
    assert!(gap("background_itl_after_ms") > 0.0, "{r}");

    // At a depth: the measured prompt follows 96 tokens already in the cache (the bench
    // refuses to report if they were not reused).
    let r = json(&[
        "--depth",
        "96",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
    ]);
    assert_eq!(r["depth"], 96);
    assert_eq!(r["prompt_tokens"], 16);
    let out = rill()
        .args(["bench", "--model", m, "--depth", "8", "--streams", "2"])
        .output()
        .unwrap();
    assert_clean_error(&out, "--depth measures one stream");

    let r = json(&["--turns", "2", "--gen-tokens", "8"]);
    let ttft = r["turn_ttft_ms"].as_array().unwrap();
    let reused = r["turn_reused_tokens"].as_array().unwrap();
    assert_eq!(ttft.len(), 2);
    assert!(
        reused[1].as_u64().unwrap() > reused[0].as_u64().unwrap(),
        "turn 2 reuses turn 1's cache: {r}"
    );
}
