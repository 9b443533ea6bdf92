//! `rill serve`'s guards and its saving, with a real HTTP client on loopback and the real
//! model: requests naming another site refused without a key, `/health` details only with the
//! key, 503 with `Retry-After` past `--max-concurrent`, chat completions saved as conversations
//! only with `--save`, and a saving server killed mid-answer leaving the answer so far.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{chat_body, client, export_json, long_stream, read_stream, Server, Q};

#[test]
fn chat_completions_are_saved_as_conversations_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("api.db");
    let db = db.to_str().unwrap();
    let quiet = Server::start(&["--db", db]);
    let http = client();
    http.post(quiet.url("/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .unwrap();
    drop(quiet);
    let saving = Server::start(&["--db", db, "--save", "--temperature", "0"]);
    let body = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": Q}], "stream": true});
    let (text, _, _) = read_stream(
        http.post(saving.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .unwrap(),
    );
    assert!(
        text.contains("Paris"),
        "the server's --temperature 0 default applied: {text}"
    );
    let t = Instant::now();
    let shown = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_rill"))
            .args(["conversations", "--db", db, "show", "1"])
            .output()
            .unwrap();
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not saved: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(shown.trim_end(), format!("user: {Q}\nassistant: {text}"));
    let list = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["conversations", "--db", db, "list", "--json"])
        .output()
        .unwrap();
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "nothing was saved without --save"
    );
    assert_eq!(list[0]["system_prompt"], "Be brief.");
}

/// Issue 13: without a key, only requests naming this machine are served. A web page can reach
/// 127.0.0.1 through a domain that resolves there (DNS rebinding): its `Host` names that domain,
/// and a page's request carries its `Origin`. Both are refused; local clients are not.
#[test]
fn without_a_key_only_requests_naming_this_machine_are_served() {
    let server = Server::start(&[]);
    let http = client();
    let status = |path: &str, host: Option<&str>, origin: Option<&str>| {
        let mut r = http.get(server.url(path));
        if let Some(h) = host {
            r = r.header("Host", h);
        }
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(status("/v1/models", None, None), 200);
    assert_eq!(status("/v1/models", Some("localhost:8080"), None), 200);
    assert_eq!(status("/v1/models", Some("[::1]:8080"), None), 200);
    assert_eq!(status("/v1/models", Some("evil.example"), None), 403);
    assert_eq!(status("/v1/models", Some("evil.example:8080"), None), 403);
    assert_eq!(
        status("/v1/models", Some("127.0.0.1.evil.example"), None),
        403
    );
    assert_eq!(status("/health", Some("evil.example"), None), 403);
    assert_eq!(
        status("/v1/models", None, Some("https://evil.example")),
        403
    );
    assert_eq!(status("/v1/models", None, Some("null")), 403);
    assert_eq!(
        status("/v1/models", None, Some("http://localhost:5173")),
        200
    );
    // A generation from a rebinding page never starts.
    let r = http
        .post(server.url("/v1/chat/completions"))
        .header("Host", "evil.example:8080")
        .json(&chat_body(false))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("evil.example"),
        "{body}"
    );
    assert_eq!(server.health()["live_generations"], 0);
}

/// Issue 13: with a key, any name may be served (the key is the guard); `/health` tells
/// liveness to anyone and what the engine holds only to a client with the key.
#[test]
fn with_a_key_health_details_need_the_key() {
    let server = Server::start(&["--api-key", "k"]);
    let http = client();
    let anon: Value = http
        .get(server.url("/health"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(anon, json!({"status": "ok"}));
    let full: Value = http
        .get(server.url("/health"))
        .bearer_auth("k")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(full["status"], "ok");
    assert_eq!(full["live_generations"], 0);
    assert!(full["model"].is_string());
    let named = http
        .get(server.url("/v1/models"))
        .header("Host", "gpu-box.example:8080")
        .bearer_auth("k")
        .send()
        .unwrap();
    assert_eq!(named.status().as_u16(), 200);
    let wrong = http
        .get(server.url("/v1/models"))
        .bearer_auth("kk")
        .send()
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
}

/// Issue 13: past `--max-concurrent` generating requests, a request is told to come back
/// (503 with `Retry-After`), and is served once a slot frees.
#[test]
fn past_max_concurrent_a_request_gets_503_with_retry_after() {
    let server = Server::start(&["--max-concurrent", "1"]);
    let http = client();
    let (lines, _) = long_stream(&server, 1);
    let busy = http
        .post(server.url("/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .unwrap();
    assert_eq!(busy.status().as_u16(), 503);
    assert_eq!(
        busy.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = busy.json().unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    drop(lines); // the first client leaves: its slot frees
    let t = Instant::now();
    loop {
        let r = http
            .post(server.url("/v1/chat/completions"))
            .json(&chat_body(false))
            .send()
            .unwrap();
        if r.status().is_success() {
            let v: Value = r.json().unwrap();
            assert!(v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .contains("Paris"));
            break;
        }
        assert_eq!(r.status().as_u16(), 503);
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the slot never freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 13: with `--save`, an API answer is written as it streams, as the window's are: a
/// server killed mid-answer (SIGKILL) leaves the question and the answer up to its last 250 ms,
/// which the next open of the database marks `interrupted`. (It was written only at the end.)
#[test]
fn a_saved_api_answer_survives_the_server_being_killed_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("api.db");
    let db = db.to_str().unwrap();
    let mut server = Server::start(&["--db", db, "--save"]);
    let (_lines, received) = long_stream(&server, 20);
    // Everything received 600 ms before the kill has been on disk for 350 ms at least.
    std::thread::sleep(Duration::from_millis(600));
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    // Fails unless the answer was saved.
    let saved = export_json(db, 1);
    let messages = saved["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "Write a very long story.");
    let answer = &messages[1];
    assert_eq!(answer["status"], "interrupted");
    let content = answer["content"].as_str().unwrap();
    assert!(
        !received.is_empty() && content.starts_with(&received),
        "saved {content:?}, received {received:?}"
    );
}

/// Issue 40: `--api-key ""` (or only spaces) served every request without a key and switched
/// the Host/Origin check off. A blank key is refused, naming the flag.
#[test]
fn a_blank_api_key_is_refused() {
    for blank in ["", "   "] {
        let out = Command::new(env!("CARGO_BIN_EXE_rill"))
            .args(["serve", "--model", common::model().to_str().unwrap()])
            .args(["--port", "0", "--api-key", blank])
            .env("RILL_LOG", "off")
            .env_remove("RILL_API_KEY")
            .output()
            .unwrap();
        common::assert_clean_error(&out, "API key is blank");
    }
}

/// Issue 40: the Host/Origin check runs with a key too: a request naming another host, or
/// from a foreign page, is served only when it carries the key.
#[test]
fn with_a_key_a_request_naming_another_host_must_carry_it() {
    let server = Server::start(&["--api-key", "k"]);
    let http = client();
    let get = |path: &str, host: Option<&str>, origin: Option<&str>, key: bool| {
        let mut r = http.get(server.url(path));
        if let Some(h) = host {
            r = r.header("Host", h);
        }
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if key {
            r = r.bearer_auth("k");
        }
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(get("/health", Some("evil.example"), None, false), 403);
    assert_eq!(get("/v1/models", Some("evil.example"), None, false), 403);
    assert_eq!(
        get("/v1/models", None, Some("https://evil.example"), false),
        403
    );
    assert_eq!(get("/health", Some("evil.example"), None, true), 200);
    assert_eq!(
        get("/v1/models", None, Some("https://evil.example"), true),
        200
    );
    assert_eq!(get("/health", None, None, false), 200);
    assert_eq!(get("/v1/models", None, None, false), 401);
}

/// Issue 40: a client that opens a connection and sends nothing is cut off after the header
/// timeout (10 s), and one that trickles its body gets 408 after the body timeout (30 s); the
/// server answers others meanwhile.
#[test]
fn a_client_that_sends_nothing_or_trickles_its_body_is_cut_off() {
    use std::io::{Read, Write};
    let server = Server::start(&[]);
    let addr = server.url("").trim_start_matches("http://").to_owned();
    let silent = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let t = Instant::now();
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf);
            (t.elapsed(), buf)
        })
    };
    let trickle = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
        let t = Instant::now();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
        )
        .unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        (t.elapsed(), String::from_utf8_lossy(&buf).into_owned())
    });
    // Meanwhile, others are served.
    assert_eq!(
        client()
            .get(server.url("/v1/models"))
            .send()
            .unwrap()
            .status(),
        200
    );
    let (took, said) = silent.join().unwrap();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(30),
        "a silent connection lasted {took:?}"
    );
    // hyper answers a request head that never came with 408, or closes at once.
    assert!(
        said.is_empty() || said.starts_with(b"HTTP/1.1 408"),
        "{said:?}"
    );
    let (took, said) = trickle.join().unwrap();
    assert!(
        took >= Duration::from_secs(29) && took < Duration::from_secs(60),
        "a trickled body was waited for {took:?}"
    );
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains("did not arrive within"), "{said}");
}
