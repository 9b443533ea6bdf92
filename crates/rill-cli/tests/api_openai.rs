//! Structured output, tool calls and the legacy completions' log-probabilities with the official
//! `openai` Python client against `rill serve` on the real model: the checks live in
//! `tests/api_openai.py` (a real client and `jsonschema`, the
//! reference validator); this runs it against a fresh server.

use std::process::Command;

mod common;
use common::Server;

#[test]
fn the_openai_client_gets_schema_valid_answers_and_calls_and_400s_for_what_cannot_be_honoured() {
    let server = Server::start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/api_openai.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&server.base)
        .output()
        .expect("python3 runs (scripts/install-deps.sh installs openai and jsonschema)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tests/api_openai.py failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("9 passed"), "{stdout}");
}
