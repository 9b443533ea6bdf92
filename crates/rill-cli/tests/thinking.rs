//! A thinking model through the `rill` binary (issue 16): the qwen2 test model under the
//! DeepSeek-R1-Distill-Qwen template (`deepseek-r1-qwen-test.Q8_0.gguf`, seeded random weights),
//! whose template opens the `<think>` block when asked to think (`--think on`;
//! `enable_thinking`). A random-weight model never closes it, so a thinking budget does. `run` splits the reasoning from the content; the official `openai`
//! client gets it as `reasoning_content`, whole and streamed; a saved answer keeps it, and a
//! process killed mid-thought loses at most its last 250 ms.

mod common;

use common::{ok, rill};

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

fn deepseek() -> String {
    common::test_model("deepseek-r1-qwen-test.Q8_0")
        .to_str()
        .unwrap()
        .to_owned()
}

/// `rill run` on the question the API test asks: greedy, 40 tokens, a budget of 16.
fn run(json: bool) -> String {
    let model = deepseek();
    let mut c = rill();
    c.args(["run", "--model", &model, "--prompt", "What is 17 times 3?"])
        .args([
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--thinking-budget",
            "16",
        ])
        .args(["--think", "on"]);
    if json {
        c.arg("--json");
    }
    ok(&mut c)
}

/// `run --json`'s reasoning, content and done event.
fn run_json() -> (String, String, Value) {
    common::run_events(&run(true))
}

#[test]
fn run_gives_the_reasoning_apart_and_a_budget_of_16_closes_the_block() {
    let (reasoning, content, done) = run_json();
    assert_eq!(done["usage"]["reasoning_tokens"], 16, "{done}");
    assert_eq!(done["usage"]["completion_tokens"], 40, "{done}");
    assert_eq!(done["reason"], "length");
    assert!(!reasoning.trim().is_empty() && !content.trim().is_empty());
    assert!(!reasoning.contains("think>") && !content.contains("think>"));
    // Plain text is the answer as the model wrote it: the block around the reasoning.
    assert_eq!(
        run(false),
        format!("<think>\n{reasoning}</think>\n\n{content}\n")
    );
    // A budget of 0 is refused before the model loads.
    let out = rill()
        .args(["run", "--model", &deepseek(), "--prompt", "hi"])
        .args(["--thinking-budget", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("thinking-budget"));
    // Not asked to think, this template closes the block at once: the answer is all content.
    let model = deepseek();
    let plain = ok(rill()
        .args(["run", "--model", &model, "--prompt", "What is 17 times 3?"])
        .args(["--temperature", "0", "--max-tokens", "8", "--json"]));
    let done: Value = serde_json::from_str(plain.lines().last().unwrap()).unwrap();
    assert_eq!(done["usage"]["reasoning_tokens"], 0, "{plain}");
}

#[test]
fn the_openai_client_gets_reasoning_content_whole_and_streamed_and_the_saved_answer_keeps_it() {
    let (reasoning, content, _) = run_json();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("api.db");
    let db = db.to_str().unwrap();
    let server = common::Server::start_with(deepseek().as_ref(), &["--save", "--db", db]);
    let api = common::api_reasoning(&server.base, &[]);
    // The API's split is the engine's, token for token.
    assert_eq!(api["reasoning"], reasoning.as_str());
    assert_eq!(api["content"], content.as_str());
    drop(server);

    // `--save` kept the reasoning beside the content, with its token count.
    let saved = common::export_json(db, 1);
    let answer = &saved["messages"][1];
    assert_eq!(answer["reasoning"], reasoning.as_str(), "{answer}");
    assert_eq!(answer["content"], content.as_str(), "{answer}");
    assert_eq!(answer["reasoning_tokens"], 16, "{answer}");
}

/// Reasoning survives SIGKILL as answer text does: what `rill chat` printed 250 ms (plus
/// 150 ms for pipes and scheduling) before the kill is saved, and the interrupted thought can
/// be continued (a budget then closes it, and the answer follows it).
#[test]
fn reasoning_killed_mid_thought_is_saved_up_to_the_last_250_ms_and_continues() {
    let model = deepseek();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rill.db");
    let db = db.to_str().unwrap();
    // `rill chat` on the thinking model, thinking on, greedy, with more flags.
    let chat = |more: &[&str]| {
        let mut c = rill();
        c.args([
            "chat",
            "--model",
            &model,
            "--temperature",
            "0",
            "--think",
            "on",
        ])
        .args(more)
        .args(["--db", db]);
        c
    };
    let mut child = chat(&["--max-tokens", "2000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap(); // kept open: the chat waits for more
    stdin.write_all(b"What is 17 times 3?\n").unwrap();
    let killed = common::kill_mid_stream(&mut child, 200, Duration::from_millis(400));
    drop(stdin);
    // Nothing but thinking so far: the block, opened and never closed.
    let thought = |printed: &str| printed.strip_prefix("<think>\n").unwrap().to_owned();
    let (printed, must) = (thought(&killed.printed), thought(&killed.before));
    assert!(!killed.printed.contains("</think>"), "{}", killed.printed);
    assert!(must.len() > 20, "enough streamed before the kill: {must:?}");

    let export = || common::export_json(db, 1);
    let saved = export();
    let answer = &saved["messages"][1];
    assert_eq!(answer["status"], "interrupted");
    assert_eq!(answer["content"], "");
    let reasoning = answer["reasoning"].as_str().unwrap().to_owned();
    assert!(
        printed.starts_with(&reasoning) && reasoning.starts_with(&must),
        "lost more than 250 ms:\nsaved {reasoning:?}\nmust {must:?}"
    );

    // Continued with a budget of 4 more tokens than it has: it thinks 4, closes, answers.
    let had = rill_tokens(&model, &reasoning);
    let budget = (had + 4).to_string();
    ok(chat(&[
        "--max-tokens",
        "16",
        "--thinking-budget",
        &budget,
        "--continue",
        "1",
    ])
    .stdin(Stdio::null()));
    let done = export();
    let answer = &done["messages"][1];
    assert_eq!(answer["status"], "done", "{answer}");
    let grown = answer["reasoning"].as_str().unwrap();
    assert!(
        grown.len() > reasoning.len() && grown.starts_with(&reasoning),
        "{answer}"
    );
    assert!(!answer["content"].as_str().unwrap().is_empty(), "{answer}");
    assert_eq!(answer["reasoning_tokens"], had as u64 + 4, "{answer}");
}

/// How many tokens `text` is (`rill tokenize`).
fn rill_tokens(model: &str, text: &str) -> usize {
    let out = ok(rill()
        .args([
            "tokenize", "--model", model, "--text", text, "--json", "--no-bos",
        ])
        .stdin(Stdio::null()));
    let v: Value = serde_json::from_str(&out).unwrap();
    v["ids"]
        .as_array()
        .map(Vec::len)
        .unwrap_or_else(|| panic!("{v}"))
}
