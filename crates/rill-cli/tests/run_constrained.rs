//! `rill run --json-schema FILE` and `--grammar FILE` on the real model, and their errors.

use std::process::{Command, Output};

mod common;
use common::model;

fn rill(args: &[&str]) -> Output {
    let m = model();
    Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["run", "--model", m.to_str().unwrap(), "--temperature", "0"])
        .args(args)
        .env("RILL_LOG", "off")
        .output()
        .unwrap()
}

/// One `error: …` line naming `mentions`, and no panic.
fn assert_error(out: &Output, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line, got: {stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(mentions),
        "{stderr}"
    );
}

#[test]
fn run_answers_in_the_schema_or_the_grammar_and_refuses_bad_files_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("user.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"name": {"type": "string"},
            "admin": {"type": "boolean"}}, "required": ["name", "admin"],
            "additionalProperties": false}"#,
    )
    .unwrap();
    let schema = schema.to_str().unwrap();
    let out = rill(&[
        "--json-schema",
        schema,
        "--max-tokens",
        "100",
        "--prompt",
        "A user?",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(v["name"].is_string() && v["admin"].is_boolean(), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");

    let lark = dir.path().join("answer.lark");
    std::fs::write(&lark, r#"start: "The answer is " ("yes" | "no") ".""#).unwrap();
    let out = rill(&[
        "--grammar",
        lark.to_str().unwrap(),
        "--prompt",
        "Is Paris in France?",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        ["The answer is yes.", "The answer is no."].contains(&text.trim()),
        "{text}"
    );

    let missing = dir.path().join("missing.json");
    assert_error(
        &rill(&["--json-schema", missing.to_str().unwrap(), "--prompt", "hi"]),
        "missing.json",
    );
    std::fs::write(dir.path().join("broken.json"), "{not json").unwrap();
    let broken = dir.path().join("broken.json");
    assert_error(
        &rill(&["--json-schema", broken.to_str().unwrap(), "--prompt", "hi"]),
        "is not JSON",
    );
    std::fs::write(dir.path().join("odd.json"), r#"{"type": "nonsense"}"#).unwrap();
    let odd = dir.path().join("odd.json");
    assert_error(
        &rill(&["--json-schema", odd.to_str().unwrap(), "--prompt", "hi"]),
        "grammar:",
    );
}
