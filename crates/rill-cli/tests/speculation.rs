//! Speculative decoding through the `rill` binary (issue 17), on the real SmolLM2 model:
//! `run --lookup` and `run --draft-model` print the plain answer with the draft counts in
//! their done event, and the API's `speculation` field (or `serve --lookup`, `serve
//! --draft-model`) gives the plain answer with OpenAI's accepted and rejected prediction
//! tokens in its usage.

mod common;

use std::process::Command;

use common::{client, model, Server};
use serde_json::{json, Value};

const ASK: &str = "Repeat this text exactly: The river carried grain from the hills to the city \
every spring. The boats were long and flat, and the boatmen sang as they poled them past the mills.";

fn run(lookup: bool) -> Vec<Value> {
    run_with(if lookup { &["--lookup"] } else { &[] })
}

fn rill_run(extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rill"))
        .env("RILL_LOG", "off")
        .args(["run", "--model", model().to_str().unwrap(), "--prompt", ASK])
        .args(["--temperature", "0", "--max-tokens", "60", "--json"])
        .args(extra)
        .output()
        .unwrap()
}

fn run_with(extra: &[&str]) -> Vec<Value> {
    let out = rill_run(extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn tokens(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["event"] == "token")
        .map(|e| e["id"].clone())
        .collect()
}

#[test]
fn run_with_a_draft_model_prints_the_plain_answer_and_counts_its_drafts() {
    let plain = run(false);
    // The model as its own draft: every proposal is right, up to the answer's end, which the
    // draft does not know of (at most one draft, 8 tokens, lies past it). A draft as dear as
    // the model does not pay, so the engine's weighing soon pauses it: a few proposals.
    let drafted = run_with(&["--draft-model", model().to_str().unwrap()]);
    assert_eq!(tokens(&drafted), tokens(&plain));
    let usage = &drafted.last().unwrap()["usage"];
    let accepted = usage["draft_accepted"].as_u64().unwrap();
    let proposed = usage["draft_proposed"].as_u64().unwrap();
    assert!(accepted > 0 && proposed - accepted <= 8, "{usage}");
    // The tokens a draft proposed say so, one per accepted token (its end token aside).
    let marked = drafted.iter().filter(|e| e["drafted"] == true).count() as u64;
    assert!(
        marked <= accepted && marked + 1 >= accepted,
        "{marked} marked, {usage}"
    );

    // One kind at a time; a draft of another vocabulary is refused with the reason.
    let both = rill_run(&["--lookup", "--draft-model", model().to_str().unwrap()]);
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("choose one"));
    let qwen = common::test_model("qwen3-test.Q8_0");
    let other = rill_run(&["--draft-model", qwen.to_str().unwrap()]);
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("cannot draft for this model"), "{err}");
}

#[test]
fn run_lookup_prints_the_plain_answer_and_counts_its_drafts() {
    let plain = run(false);
    let fast = run(true);
    assert_eq!(tokens(&fast), tokens(&plain));
    let done = fast.last().unwrap();
    let (proposed, accepted) = (
        &done["usage"]["draft_proposed"],
        &done["usage"]["draft_accepted"],
    );
    assert!(accepted.as_u64().unwrap() > 10, "{done}");
    assert!(accepted.as_u64() <= proposed.as_u64(), "{done}");
    assert!(plain.last().unwrap()["usage"]
        .get("draft_proposed")
        .is_none());
}

fn ask(server: &Server, speculation: Option<&str>) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": ASK}],
        "temperature": 0,
        "max_tokens": 60,
    });
    if let Some(s) = speculation {
        body["speculation"] = json!(s);
    }
    client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

#[test]
fn the_api_speculates_when_asked_or_by_default_and_reports_predictions() {
    let server = Server::start(&[]);
    let plain = ask(&server, None);
    let fast = ask(&server, Some("lookup"));
    let text = |r: &Value| r["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&fast), text(&plain));
    let details = &fast["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 10,
        "{fast}"
    );
    assert!(
        plain["usage"].get("completion_tokens_details").is_none(),
        "{plain}"
    );
    // A value it does not know is a 400 that names the field, and so is "draft" where the
    // server has no draft model.
    for (kind, says) in [("sideways", "not a kind"), ("draft", "no draft model")] {
        let bad = client()
            .post(server.url("/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "speculation": kind}))
            .send()
            .unwrap();
        assert_eq!(bad.status(), 400);
        let err: Value = bad.json().unwrap();
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(msg.contains("speculation") && msg.contains(says), "{err}");
    }
    drop(server);

    // `serve --draft-model`: requests that do not say draft with it; "lookup" and "off" still
    // choose.
    let server = Server::start(&["--draft-model", model().to_str().unwrap()]);
    let drafted = ask(&server, None);
    assert_eq!(text(&drafted), text(&plain));
    // (The model as its own draft: all taken, up to the answer's end; the engine's weighing
    // soon pauses a draft as dear as the model, so a few.)
    let details = &drafted["usage"]["completion_tokens_details"];
    assert!(
        details["accepted_prediction_tokens"].as_u64().unwrap() > 0,
        "{drafted}"
    );
    assert!(
        details["rejected_prediction_tokens"].as_u64().unwrap_or(0) <= 8,
        "{drafted}"
    );
    let off = ask(&server, Some("off"));
    assert!(off["usage"].get("completion_tokens_details").is_none());
    assert_eq!(text(&ask(&server, Some("draft"))), text(&plain));
    drop(server);

    // `serve --lookup`: requests that do not say speculate; one that says "off" does not.
    let server = Server::start(&["--lookup"]);
    let by_default = ask(&server, None);
    assert_eq!(text(&by_default), text(&plain));
    assert!(
        by_default["usage"]["completion_tokens_details"]["accepted_prediction_tokens"]
            .as_u64()
            .is_some_and(|n| n > 10)
    );
    let off = ask(&server, Some("off"));
    assert!(
        off["usage"].get("completion_tokens_details").is_none(),
        "{off}"
    );
}
