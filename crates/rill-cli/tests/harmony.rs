//! gpt-oss's harmony through the `rill` binary (issue 18): the gpt-oss test model (seeded
//! random weights, `scripts/make-test-models.py`) under the real gpt-oss template. A
//! random-weight model writes no harmony of its own: with a thinking budget Rill opens the
//! analysis message as gpt-oss does first, and closes it after the budget with the final
//! message's header. `run --json` gives the analysis as reasoning and the final message as
//! content; the official `openai` client gets the same as `reasoning_content` and `content`,
//! whole and streamed (`tests/api_reasoning.py --harmony`).

mod common;

use serde_json::Value;

fn gpt_oss() -> std::path::PathBuf {
    common::test_model("gpt-oss-test.MXFP4")
}

/// `rill run --json` on the question the API test asks: greedy, 40 tokens, a budget of 16.
fn run_json() -> (String, String, Value) {
    let out = common::ok(
        common::rill()
            .args(["run", "--model", gpt_oss().to_str().unwrap()])
            .args(["--prompt", "What is 17 times 3?", "--temperature", "0"])
            .args(["--max-tokens", "40", "--thinking-budget", "16", "--json"]),
    );
    common::run_events(&out)
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
    let api = common::api_reasoning(&server.base, &["--harmony"]);
    // The API's split is the engine's, token for token.
    assert_eq!(api["reasoning"], reasoning.as_str());
    assert_eq!(api["content"], content.as_str());
}
