//! Speculative decoding by prompt lookup through the `rill` binary (issue 17), on the real
//! SmolLM2 model: `run --lookup` prints the plain answer with the draft counts in its done
//! event, and the API's `speculation` field (or `serve --lookup`) gives the plain answer with
//! OpenAI's accepted and rejected prediction tokens in its usage.

mod common;

use std::process::Command;

use common::{client, model, Server};
use serde_json::{json, Value};

const ASK: &str = "Repeat this text exactly: The river carried grain from the hills to the city \
every spring. The boats were long and flat, and the boatmen sang as they poled them past the mills.";

fn run(lookup: bool) -> Vec<Value> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rill"));
    c.env("RILL_LOG", "off")
        .args(["run", "--model", model().to_str().unwrap(), "--prompt", ASK])
        .args(["--temperature", "0", "--max-tokens", "60", "--json"]);
    if lookup {
        c.arg("--lookup");
    }
    let out = c.output().unwrap();
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

#[test]
fn run_lookup_prints_the_plain_answer_and_counts_its_drafts() {
    let plain = run(false);
    let fast = run(true);
    let tokens = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["event"] == "token")
            .map(|e| e["id"].clone())
            .collect()
    };
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
    // A value it does not know is a 400 that names the field.
    let bad = client()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "speculation": "draft"}))
        .send()
        .unwrap();
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("speculation"),
        "{err}"
    );
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
