//! What the API tests share: the real model's path, an HTTP client, and `rill serve` on a free
//! loopback port.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::Value;

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

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_rill"))
            .args([
                "serve",
                "--model",
                model().to_str().unwrap(),
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
