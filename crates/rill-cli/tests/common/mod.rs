//! What the CLI and API tests share: the real model's path, the `rill` binary, an HTTP client,
//! `rill serve` on a free loopback port, the API tests' question and SSE reader, a check that
//! a command failed with one clean error line, and the reasoning tests' parts.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::{json, Value};

pub fn model() -> PathBuf {
    let p = std::env::var_os("RILL_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        p.is_file(),
        "test model missing at {}: run scripts/fetch-test-model.sh",
        p.display()
    );
    p
}

/// An HTTP client without reqwest's 30 s default timeout: on a loaded 2-core machine a long
/// stream can take longer than that, and a hang is caught by the test harness anyway.
pub fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

/// `rill serve` on a free loopback port, stopped when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
}

/// Conversation `id` of the database `db`, as `rill conversations export --format json` gives it.
pub fn export_json(db: &str, id: i64) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["conversations", "--db", db, "export", &id.to_string()])
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A test model of `scripts/make-test-models.py` (seeded random weights), by file stem.
/// The `rill` binary, with no model from the environment and no logs.
pub fn rill() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rill"));
    c.env_remove("RILL_MODEL").env("RILL_LOG", "off");
    c
}

/// `c`'s stdout, once it has succeeded (its stderr in the failure otherwise).
pub fn ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `rill run --json`'s output as its reasoning, its content and its done event.
pub fn run_events(stdout: &str) -> (String, String, Value) {
    let (mut reasoning, mut content, mut done) = (String::new(), String::new(), Value::Null);
    for line in stdout.lines() {
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

/// `tests/api_reasoning.py` against the server at `base` (with `extra` arguments), which must
/// pass; its last line, the whole answer's reasoning and content.
pub fn api_reasoning(base: &str, extra: &[&str]) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/api_reasoning.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(base)
        .args(extra)
        .output()
        .expect("python3 runs (scripts/install-deps.sh installs openai)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/api_reasoning.py {extra:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

pub fn test_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("RILL_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/test-models")
        });
    let p = dir.join(format!("{name}.gguf"));
    assert!(
        p.is_file(),
        "test model missing at {}: run python3 scripts/make-test-models.py",
        p.display()
    );
    p
}

/// What a process printed before it was killed with SIGKILL mid-stream: all of it, and what it
/// had printed at least `margin` before the kill (what must have reached the disk).
pub struct Killed {
    pub printed: String,
    pub before: String,
}

/// Reads `child`'s stdout until at least `enough` bytes came over at least a second (machines
/// under load are slow), then kills it with SIGKILL.
pub fn kill_mid_stream(child: &mut Child, enough: usize, margin: Duration) -> Killed {
    use std::io::Read;
    use std::sync::{Arc, Mutex};

    let received: Arc<Mutex<Vec<(Instant, u8)>>> = Arc::default();
    let mut stdout = child.stdout.take().unwrap();
    let sink = received.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            let now = Instant::now();
            sink.lock()
                .unwrap()
                .extend(buf[..n].iter().map(|&b| (now, b)));
        }
    });
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let got = received.lock().unwrap();
        if got.len() >= enough
            && got
                .first()
                .is_some_and(|(t, _)| t.elapsed() > Duration::from_millis(1000))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the answer did not stream"
        );
    }
    let killed_at = Instant::now();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();

    let received = received.lock().unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    let cutoff = killed_at - margin;
    Killed {
        printed: text(received.iter().map(|(_, b)| *b).collect()),
        before: text(
            received
                .iter()
                .filter(|(t, _)| *t <= cutoff)
                .map(|(_, b)| *b)
                .collect(),
        ),
    }
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with(&model(), extra)
    }

    /// `rill serve` on another model file.
    pub fn start_with(model: &std::path::Path, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_rill"))
            .args([
                "serve",
                "--model",
                model.to_str().unwrap(),
                "--port",
                &port.to_string(),
            ])
            .args(extra)
            .env("RILL_LOG", "off")
            .env_remove("RILL_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let t = Instant::now();
        while client()
            .get(format!("{}/health", server.base))
            .send()
            .is_err()
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "rill serve did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn health(&self) -> Value {
        client()
            .get(self.url("/health"))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The question the API tests ask.
pub const Q: &str = "What is the capital of France? Answer in one word.";

/// A greedy chat request asking [`Q`].
pub fn chat_body(stream: bool) -> Value {
    json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": Q}], "temperature": 0, "stream": stream})
}

/// Starts a long streamed answer and reads its first `n` chunks: the rest of the stream, and
/// the text those chunks carried.
pub fn long_stream(
    server: &Server,
    n: usize,
) -> (
    std::io::Lines<BufReader<reqwest::blocking::Response>>,
    String,
) {
    let body = json!({"messages": [{"role": "user", "content": "Write a very long story."}], "temperature": 0, "max_tokens": 400, "stream": true});
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .unwrap();
    let mut lines = BufReader::new(resp).lines();
    let (mut chunks, mut received) = (0, String::new());
    while chunks < n {
        let line = lines.next().unwrap().unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).unwrap();
            received.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
            chunks += 1;
        }
    }
    (lines, received)
}

/// Reads an SSE response: the concatenated deltas, the finish reason, the usage chunk.
pub fn read_stream(resp: reqwest::blocking::Response) -> (String, Option<String>, Option<Value>) {
    let (mut text, mut finish, mut usage) = (String::new(), None, None);
    let mut done = false;
    for line in BufReader::new(resp).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if let Some(f) = chunk["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
        if chunk["usage"].is_object() {
            usage = Some(chunk["usage"].clone());
        }
    }
    assert!(done, "the stream ends with [DONE]");
    (text, finish, usage)
}

/// Non-zero exit, exactly one line on stderr, starting with `error:`, and no panic.
pub fn assert_clean_error(out: &Output, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[0].contains(mentions), "`{mentions}` not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
