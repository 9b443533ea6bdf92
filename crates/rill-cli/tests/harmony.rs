//! gpt-oss's harmony through the `rill` binary (issue 18): the gpt-oss test model (seeded
//! random weights, `scripts/make-test-models.py`) under the real gpt-oss template. A
//! random-weight model writes no harmony of its own: with a thinking budget Rill opens the
//! analysis message as gpt-oss does first, and closes it after the budget with the final
//! message's header. `run --json` gives the analysis as reasoning and the final message as
//! content; the official `openai` client gets the same as `reasoning_content` and `content`,
//! whole and streamed (`tests/api_reasoning.py --harmony`).

mod common;

use std::process::Command;

use serde_json::Value;

fn gpt_oss() -> std::path::PathBuf {
    common::test_model("gpt-oss-test.MXFP4")
}

/// `rill run --json` on the question the API test asks: greedy, 40 tokens, a budget of 16.
fn run_json() -> (String, String, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .env_remove("RILL_MODEL")
        .env("RILL_LOG", "off")
        .args(["run", "--model", gpt_oss().to_str().unwrap()])
        .args(["--prompt", "What is 17 times 3?", "--temperature", "0"])
        .args(["--max-tokens", "40", "--thinking-budget", "16", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut reasoning, mut content, mut done) = (String::new(), String::new(), Value::Null);
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        match v["event"].as_str() {
            Some("token") => {
                reasoning.push_str(v["reasoning"].as_str().unwrap_or_default());
                content.push_str(v["text"].as_str().unwrap());
            }
            _ => done = v,
        }
    }
    (reasoning, content, done)
}

#[test]
fn analysis_and_final_channels_arrive_as_reasoning_and_content_in_run_and_the_api() {
    let (reasoning, content, done) = run_json();
    assert_eq!(done["usage"]["reasoning_tokens"], 16, "{done}");
    assert_eq!(done["usage"]["completion_tokens"], 40, "{done}");
    assert!(!reasoning.is_empty() && !content.is_empty());
    for m in ["<|channel|>", "<|message|>", "<|start|>", "<|end|>"] {
        assert!(!reasoning.contains(m) && !content.contains(m), "{m}");
    }

    let server = common::Server::start_with(&gpt_oss(), &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/api_reasoning.py");
    let out = Command::new("python3")
        .arg(script)
        .args([server.base.as_str(), "--harmony"])
        .output()
        .expect("python3 runs (scripts/install-deps.sh installs openai)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/api_reasoning.py --harmony failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // The API's split is the engine's, token for token.
    assert_eq!(api["reasoning"], reasoning.as_str());
    assert_eq!(api["content"], content.as_str());
}
