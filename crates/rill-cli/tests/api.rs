//! The OpenAI-compatible API with a real HTTP client against `rill serve` on loopback, on the
//! real model; and `rill run --remote` against it.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{chat_body, client, long_stream, model, read_stream, Server, Q};

fn rill_run_answer() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([
            "run",
            "--model",
            model().to_str().unwrap(),
            "--temperature",
            "0",
            "--prompt",
            Q,
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

#[test]
fn streamed_and_whole_answers_equal_rill_run_with_the_right_usage() {
    let server = Server::start(&[]);
    let http = client();
    let expected = rill_run_answer();
    assert!(expected.contains("Paris"));

    let whole: Value = http
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["content"], expected.as_str());
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        whole["usage"],
        json!({"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49})
    );

    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = http
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let (text, finish, usage) = read_stream(resp);
    assert_eq!(text, expected);
    assert_eq!(finish.as_deref(), Some("stop"));
    assert_eq!(usage.unwrap()["completion_tokens"], 7);

    // Text-part content, max_completion_tokens, the raw completions endpoint, the model list.
    let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": Q}]}], "temperature": 0, "max_completion_tokens": 3});
    let r: Value = http
        .post(server.url("/v1/chat/completions"))
        .json(&parts)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 3);
    let raw: Value = http
        .post(server.url("/v1/completions"))
        .json(&json!({"prompt": "The capital of France is", "temperature": 0, "max_tokens": 4}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(raw["object"], "text_completion");
    assert!(
        raw["choices"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Paris"),
        "{raw}"
    );
    let models: Value = http
        .get(server.url("/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1");
}

/// Solo means alone in a fresh process (`rill run`), so neither batching nor a cached prefix
/// from another request is involved; the server starts fresh too.
#[test]
fn eight_concurrent_streams_equal_their_solo_runs_exactly() {
    let questions: Vec<String> = (0..8)
        .map(|i| format!("Name one thing about the number {i}."))
        .collect();
    let solo: Vec<String> = questions
        .iter()
        .map(|q| {
            let out = Command::new(env!("CARGO_BIN_EXE_rill"))
                .args([
                    "run",
                    "--model",
                    model().to_str().unwrap(),
                    "--temperature",
                    "0",
                    "--max-tokens",
                    "24",
                    "--prompt",
                    q,
                ])
                .output()
                .unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim_end_matches('\n')
                .to_owned()
        })
        .collect();
    let server = Server::start(&[]);
    let url = server.url("/v1/chat/completions");
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = questions
            .iter()
            .map(|q| {
                let body = json!({"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 24, "stream": true});
                let url = url.clone();
                s.spawn(move || read_stream(client().post(url).json(&body).send().unwrap()).0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every row's arithmetic is independent of the rows beside it (docs/kernels.md):
    // answers decoded together are the answers alone, exactly (issue 13).
    for (i, (a, b)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(a, b, "concurrent answer {i} differs from its solo run");
    }
}

#[test]
fn bad_requests_get_openai_shaped_errors_and_the_server_keeps_serving() {
    let server = Server::start(&[]);
    let http = client();
    let post = |body: String| {
        http.post(server.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap()
    };
    let check = |resp: reqwest::blocking::Response, status: u16, param: Option<&str>| {
        assert_eq!(resp.status().as_u16(), status);
        let v: Value = resp.json().unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(v["error"]["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{v}");
        }
    };
    check(post("{\"messages\": [".into()), 400, None);
    check(
        post(
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})
                .to_string(),
        ),
        400,
        None,
    );
    check(
        post(
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).to_string(),
        ),
        400,
        Some("temperature"),
    );
    check(
        post(json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 2}).to_string()),
        400,
        Some("top_p"),
    );
    check(
        post(json!({"messages": [{"role": "user", "content": "hi"}], "n": 2}).to_string()),
        400,
        Some("n"),
    );
    check(
        post(
            json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        ),
        400,
        Some("model"),
    );
    check(
        post(json!({"messages": [{"role": "wizard", "content": "hi"}]}).to_string()),
        400,
        Some("messages[0].role"),
    );
    check(
        post(json!({"messages": []}).to_string()),
        400,
        Some("messages"),
    );
    // Over the 32 MB limit (room for a 20 MB image in base64).
    let too_large =
        post(json!({"messages": [{"role": "user", "content": "x".repeat(33 << 20)}]}).to_string());
    // The unread rest of the body makes the connection unusable: the client is told to drop it,
    // so its next request does not go out on a connection being closed.
    assert_eq!(too_large.headers()["connection"], "close");
    check(too_large, 413, None);
    assert_eq!(server.health()["status"], "ok");
    let ok: Value = http
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(ok["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("Paris"));

    let keyed = Server::start(&["--api-key", "s3cret"]);
    let with_key = |key: Option<&str>| {
        let r = http
            .post(keyed.url("/v1/chat/completions"))
            .json(&chat_body(false));
        match key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
        .send()
        .unwrap()
    };
    check(with_key(None), 401, None);
    check(with_key(Some("wrong")), 401, None);
    assert_eq!(with_key(Some("s3cret")).status().as_u16(), 200);

    // Beyond loopback without a key: refused at start.
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([
            "serve",
            "--model",
            model().to_str().unwrap(),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .env_remove("RILL_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs an API key"));
}

#[test]
fn a_client_that_leaves_mid_stream_cancels_its_generation_and_frees_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("api.db");
    let db = db.to_str().unwrap();
    let server = Server::start(&["--db", db, "--save"]);
    let (lines, received) = long_stream(&server, 5);
    let during = server.health();
    assert_eq!(during["live_generations"], 1);
    assert!(during["cache_bytes"].as_u64().unwrap() > 0);
    drop(lines); // the client hangs up
    let t = Instant::now();
    loop {
        let h = server.health();
        if h["live_generations"] == 0 && h["cache_bytes"] == 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "generation still alive: {h}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // With --save, the partial answer is kept as a stopped answer, holding what was sent.
    let saved = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_rill"))
            .args([
                "conversations",
                "--db",
                db,
                "export",
                "1",
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        if out.status.success() {
            break serde_json::from_slice::<Value>(&out.stdout).unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the partial answer was not saved"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let last = saved["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["status"], "stopped");
    let content = last["content"].as_str().unwrap();
    assert!(
        !received.is_empty() && content.starts_with(&received),
        "saved {content:?}, sent {received:?}"
    );
}

#[test]
fn run_remote_streams_the_same_answer_from_a_rill_server() {
    let server = Server::start(&["--api-key", "k"]);
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rill"))
            .args([
                "run",
                "--remote",
                &server.base,
                "--remote-model",
                "SmolLM2-135M-Instruct.Q4_1",
                "--temperature",
                "0",
            ])
            .args(["--prompt", Q])
            .args(extra)
            .env_remove("RILL_API_KEY")
            .output()
            .unwrap()
    };
    let out = run(&["--api-key", "k"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        rill_run_answer()
    );

    let out = run(&["--api-key", "k", "--json"]);
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.last().unwrap()["event"], "done");
    assert_eq!(lines.last().unwrap()["usage"]["completion_tokens"], 7);

    let out = run(&["--api-key", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains("API key"),
        "{err}"
    );
    drop(server);
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([
            "run",
            "--remote",
            "http://127.0.0.1:9",
            "--remote-model",
            "m",
            "--prompt",
            "hi",
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("error: cannot reach"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 4 (with issue 7's candidates): `logprobs` / `top_logprobs` on chat completions, whole
/// and streamed, in OpenAI's shape; wrong combinations are clear 400s.
#[test]
fn logprobs_give_each_token_its_probability_and_alternatives() {
    let server = Server::start(&[]);
    let http = client();
    let mut body = chat_body(false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let whole: Value = http
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains("Paris"), "{whole}");
    let check = |entries: &[Value]| -> String {
        let mut joined = String::new();
        for e in entries {
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3, "{e}");
            // Temperature 0: the chosen token is the likeliest alternative.
            assert_eq!(e["token"], top[0]["token"], "{e}");
            assert_eq!(e["logprob"], top[0]["logprob"], "{e}");
            let mass: f64 = top
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap().exp())
                .sum();
            assert!(
                e["logprob"].as_f64().unwrap() <= 0.0 && mass <= 1.0 + 1e-6,
                "{e}"
            );
            let bytes: Vec<u8> = e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
                .collect();
            joined.push_str(&String::from_utf8(bytes).unwrap());
        }
        joined
    };
    let entries = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(check(entries), text, "the tokens spell the answer");

    body["stream"] = json!(true);
    let resp = http
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    let mut streamed = Vec::new();
    for line in BufReader::new(resp).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = v["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(c.iter().cloned());
        }
    }
    assert_eq!(
        check(&streamed),
        text,
        "streamed entries spell the same answer"
    );

    let refused = |path: &str, extra: Value, param: &str| {
        let mut b = chat_body(false);
        if path == "/v1/completions" {
            b = json!({"prompt": "Hello", "max_tokens": 2});
        }
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = http.post(server.url(path)).json(&b).send().unwrap();
        assert_eq!(r.status(), 400);
        let e: Value = r.json().unwrap();
        assert_eq!(e["error"]["param"], param, "{e}");
    };
    refused(
        "/v1/chat/completions",
        json!({"top_logprobs": 2}),
        "top_logprobs",
    );
    refused(
        "/v1/chat/completions",
        json!({"logprobs": true, "top_logprobs": 21}),
        "top_logprobs",
    );
    refused("/v1/completions", json!({"logprobs": true}), "logprobs");
}
