//! The `rill` binary as a user runs it, on the real SmolLM2 model.

mod common;

use common::{assert_clean_error, model, rill};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn run_ok(args: &[&str]) -> String {
    let out = rill().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "rill {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `rill ARGS` with `input` on its standard input; its output once it exits.
fn run_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = rill()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A JSON array of integers.
fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

#[test]
fn run_answers_paris_and_streams_it() {
    let m = model();
    let mut child = rill()
        .args([
            "run",
            "--model",
            m.to_str().unwrap(),
            "--temperature",
            "0",
            "--json",
            "--max-tokens",
            "48",
        ])
        .args(["--prompt", "What is the capital of France?"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"], "token");
    // The first token is on our side of the pipe while the process is still producing the rest.
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first token arrived only after the process ended"
    );
    let rest: Vec<serde_json::Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert!(child.wait().unwrap().success());
    let done = rest.last().unwrap();
    assert_eq!(done["event"], "done");
    assert_eq!(done["usage"]["prompt_tokens"], 37);
    assert_eq!(
        done["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        rest.len()
    );
    assert!(done["timings"]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(["stop", "length"].contains(&done["reason"].as_str().unwrap()));

    let plain = run_ok(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--temperature",
        "0",
        "--prompt",
        "What is the capital of France? Answer in one word.",
    ]);
    assert_eq!(plain.trim(), "The capital of France is Paris.");
}

#[test]
fn run_continues_a_conversation_from_a_messages_file_and_reads_stdin() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("conv.json");
    std::fs::write(
        &file,
        r#"[{"role":"user","content":"Hi, my name is Ana."},{"role":"assistant","content":"Hello Ana! How can I help you today?"},{"role":"user","content":"What is the capital of France? Answer in one word."}]"#,
    )
    .unwrap();
    let out = run_ok(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        "--messages",
        file.to_str().unwrap(),
    ]);
    assert!(out.contains("Paris"), "{out}");

    let out = run_with_stdin(
        &[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "16",
        ],
        b"What is the capital of France? Answer in one word.\n",
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Paris"));
}

#[test]
fn run_stop_strings_and_seeds() {
    let m = model();
    let m = m.to_str().unwrap();
    let q = "What is the capital of France? Answer in one word.";
    let out = run_ok(&[
        "run",
        "--model",
        m,
        "--temperature",
        "0",
        "--stop",
        " Paris",
        "--prompt",
        q,
    ]);
    assert_eq!(out.trim_end(), "The capital of France is");
    let sampled = |seed: &str| {
        run_ok(&[
            "run",
            "--model",
            m,
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--max-tokens",
            "24",
            "--prompt",
            "Tell me a story.",
        ])
    };
    assert_eq!(sampled("5"), sampled("5"));
}

/// `rill chat` on the test model, greedy, saving into `db`, stdin and stdout piped.
fn spawn_chat(db: &Path, max_tokens: usize) -> std::process::Child {
    rill()
        .args([
            "chat",
            "--model",
            model().to_str().unwrap(),
            "--temperature",
            "0",
        ])
        .args([
            "--max-tokens",
            &max_tokens.to_string(),
            "--db",
            db.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn chat_keeps_the_conversation_saves_it_and_ends_at_end_of_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rill.db");
    let mut child = spawn_chat(&db, 24);
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France? Answer in one word.\nAnd of Italy? Answer in one word.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(answers.len() >= 2, "two answers: {text}");
    assert!(answers[0].contains("Paris"), "{text}");
    assert!(
        text.contains("Rome"),
        "the second turn sees the first: {text}"
    );

    // Saved: the store holds the four turns, and `conversations` reads them back.
    let db = db.to_str().unwrap();
    let shown = run_ok(&["conversations", "--db", db, "show", "1"]);
    assert_eq!(shown.lines().count(), 4, "{shown}");
    assert!(
        shown.starts_with("user: What is the capital of France?"),
        "{shown}"
    );
    assert!(run_ok(&["conversations", "--db", db, "search", "rome"]).contains("[Rome]"));
    let list: serde_json::Value =
        serde_json::from_str(&run_ok(&["conversations", "--db", db, "list", "--json"])).unwrap();
    assert_eq!(
        list[0]["title"],
        "What is the capital of France? Answer in one word."
    );

    // Export → import → export is lossless; Markdown reads well; delete removes it.
    let json_path = dir.path().join("conv.json");
    run_ok(&[
        "conversations",
        "--db",
        db,
        "export",
        "1",
        "--format",
        "json",
        "--output",
        json_path.to_str().unwrap(),
    ]);
    assert!(run_ok(&[
        "conversations",
        "--db",
        db,
        "import",
        json_path.to_str().unwrap()
    ])
    .contains("conversation 2"));
    assert_eq!(
        run_ok(&["conversations", "--db", db, "export", "2"]).trim_end(),
        std::fs::read_to_string(&json_path).unwrap().trim_end()
    );
    assert!(
        run_ok(&["conversations", "--db", db, "export", "1", "--format", "md"])
            .contains("## Assistant\n\nThe capital of Italy is Rome.")
    );
    run_ok(&["conversations", "--db", db, "delete", "2"]);
    let out = rill()
        .args(["conversations", "--db", db, "show", "2"])
        .output()
        .unwrap();
    assert_clean_error(&out, "conversation 2 not found");
}

/// Issue 5: a process killed with SIGKILL mid-answer loses at most the last 250 ms of it.
#[test]
fn an_answer_killed_mid_stream_is_saved_up_to_the_last_250_ms_and_can_be_continued() {
    use std::time::Duration;

    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rill.db");
    let mut child = spawn_chat(&db, 400);
    let mut stdin = child.stdin.take().unwrap(); // kept open: the chat waits for more
    stdin
        .write_all(b"Write a long story about a dragon who learns to bake bread.\n")
        .unwrap();
    // Well into the answer: 120 bytes out, over a second at least. Everything printed 250 ms
    // (plus 150 ms for pipes and scheduling) before the kill is saved.
    let killed = common::kill_mid_stream(&mut child, 120, Duration::from_millis(400));
    drop(stdin);
    let (printed, must) = (killed.printed, killed.before);
    assert!(must.len() > 20, "enough streamed before the kill: {must:?}");

    let db = db.to_str().unwrap();
    let shown = run_ok(&["conversations", "--db", db, "show", "1"]);
    let saved = shown
        .split_once("assistant [interrupted]: ")
        .expect("an interrupted answer")
        .1
        .trim_end();
    assert!(
        printed.starts_with(saved),
        "saved text is what was printed:\n{saved}\n---\n{printed}"
    );
    assert!(
        saved.starts_with(must.trim_end()),
        "lost more than 250 ms:\nsaved {saved:?}\nmust {must:?}"
    );

    // `--continue` finishes the interrupted answer in place.
    let out = rill()
        .args([
            "chat",
            "--model",
            m.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            "8",
        ])
        .args(["--db", db, "--continue", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = run_ok(&["conversations", "--db", db, "show", "1"]);
    let last = shown
        .lines()
        .rfind(|l| l.starts_with("assistant"))
        .unwrap()
        .to_owned();
    assert!(!shown.contains("[interrupted]"), "{shown}");
    let continued = shown.split_once("assistant: ").unwrap().1;
    assert!(
        continued.starts_with(saved) && continued.trim_end().len() > saved.len(),
        "{last}"
    );
}

fn write_gguf_with_architecture(path: &Path, arch: &str) {
    // A minimal GGUF v3: header, one metadata entry (general.architecture), no tensors.
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    let key = b"general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(8u32.to_le_bytes()); // string
    b.extend((arch.len() as u64).to_le_bytes());
    b.extend(arch.as_bytes());
    std::fs::write(path, b).unwrap();
}

#[test]
fn bad_input_gets_one_clear_error_line_and_no_panic() {
    let m = model();
    let m = m.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let q = ["--prompt", "hi"];
    let run = |args: &[&str]| {
        rill()
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    let missing = dir.path().join("nope.gguf");
    assert_clean_error(
        &run(&["--model", missing.to_str().unwrap(), q[0], q[1]]),
        "no such file",
    );

    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(m).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_error(
        &run(&["--model", truncated.to_str().unwrap(), q[0], q[1]]),
        "truncated",
    );

    let header_only = dir.path().join("header.gguf");
    std::fs::write(&header_only, &bytes[..4096]).unwrap();
    assert_clean_error(
        &run(&["--model", header_only.to_str().unwrap(), q[0], q[1]]),
        "GGUF",
    );

    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, "this is not a model\n").unwrap();
    assert_clean_error(
        &run(&["--model", not_gguf.to_str().unwrap(), q[0], q[1]]),
        "not a GGUF file",
    );

    let bert = dir.path().join("bert.gguf");
    write_gguf_with_architecture(&bert, "bert");
    assert_clean_error(
        &run(&["--model", bert.to_str().unwrap(), q[0], q[1]]),
        "unsupported architecture `bert`",
    );

    assert_clean_error(&run(&["--model", m, "--top-p", "2", q[0], q[1]]), "top_p");
    assert_clean_error(
        &run(&["--model", m, "--temperature", "nan", q[0], q[1]]),
        "temperature",
    );
    assert_clean_error(
        &run(&["--model", m, "--temperature", "-1", q[0], q[1]]),
        "temperature",
    );
    assert_clean_error(&run(&["--model", m, "--top-k", "0", q[0], q[1]]), "top_k");
    assert_clean_error(&run(&["--model", m, "--prompt", ""]), "empty");
    assert_clean_error(&run(&["--model", m]), "empty"); // stdin is empty
    assert_clean_error(
        &run(&[
            "--model",
            m,
            "--ctx-size",
            "16",
            "--prompt",
            "Tell me everything about the history of France.",
        ]),
        "context",
    );
    let bad_json = dir.path().join("bad.json");
    std::fs::write(&bad_json, "{not json").unwrap();
    assert_clean_error(
        &run(&["--model", m, "--messages", bad_json.to_str().unwrap()]),
        "bad.json",
    );
}

#[test]
fn models_import_lists_the_file_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let env = |c: &mut Command| {
        c.env("RILL_MODELS_DIR", dir.path())
            .env("HF_HOME", dir.path().join("hf"));
    };
    let mut c = rill();
    env(&mut c);
    let out = c
        .args(["models", "import", m.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("llama"));
    let mut c = rill();
    env(&mut c);
    let out = c.args(["models", "list", "--json"]).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["source"], "imported");
    assert_eq!(list[0]["quantization"], "Q4_1");
    assert_eq!(list[0]["path"], m.canonicalize().unwrap().to_str().unwrap());
    // Nothing was copied into the models folder.
    assert!(std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .all(|e| e.path().extension().is_none_or(|x| x != "gguf")));

    let mut c = rill();
    env(&mut c);
    let not_gguf = dir.path().join("x.gguf");
    std::fs::write(&not_gguf, "nope").unwrap();
    assert_clean_error(
        &c.args(["models", "import", not_gguf.to_str().unwrap()])
            .output()
            .unwrap(),
        "not a GGUF file",
    );
}

/// Issue 14: `rill tokenize` prints a prompt's ids and pieces; on every golden prompt its ids are
/// llama.cpp's (`../shared/golden/`).
#[test]
fn tokenize_gives_llama_cpps_ids_and_the_pieces() {
    let golden = std::env::var_os("RILL_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/golden/smollm2-q4_1-llama.cpp.json"));
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
    let m = model();
    for case in golden["cases"].as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let want = u64s(&case["prompt_ids"]);
        let out = run_with_stdin(
            &["tokenize", "--model", m.to_str().unwrap(), "--json"],
            prompt.as_bytes(),
        );
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids = u64s(&v["ids"]);
        assert_eq!(ids, want, "{}", case["name"]);
        assert_eq!(v["pieces"].as_array().unwrap().len(), ids.len());
    }
    let plain = run_ok(&[
        "tokenize",
        "--model",
        m.to_str().unwrap(),
        "--text",
        "<|im_start|>Hello world",
    ]);
    assert_eq!(
        plain.lines().map(str::trim).collect::<Vec<_>>(),
        ["1 -> '<|im_start|>'", "19556 -> 'Hello'", "905 -> ' world'"],
        "{plain}"
    );
    let no_tokens = rill().args(["tokenize", "--text", "x"]).output().unwrap();
    assert_clean_error(&no_tokens, "no model");
}
