//! A hostile model file beside good ones (issue 40): `rill models list` over a folder holding
//! files whose chat templates crashed or hung it (a template that does not compile, one whose
//! render never ends) and the real model lists every one, the hostile ones with their error,
//! promptly; and `rill run` on one says what is wrong with it, in one line.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{assert_clean_error, model, ok, rill};

/// A header-only GGUF: version 3, no tensors, string metadata.
fn header_only(metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        out.extend((k.len() as u64).to_le_bytes());
        out.extend(k.as_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend((v.len() as u64).to_le_bytes());
        out.extend(v.as_bytes());
    }
    out
}

#[test]
fn models_list_names_a_hostile_file_beside_the_real_model() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, template: &str| {
        let bytes = header_only(&[
            ("general.architecture", "llama"),
            ("general.name", name),
            ("tokenizer.chat_template", template),
        ]);
        std::fs::write(dir.path().join(format!("{name}.gguf")), bytes).unwrap();
    };
    write("broken", "<think>{%}");
    write(
        "endless",
        "<think>{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    );
    write(
        "selfish",
        "<think>{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}",
    );
    std::os::unix::fs::symlink(model(), dir.path().join("real.gguf")).unwrap();
    let list = |args: &[&str]| {
        let t = Instant::now();
        let out = ok(rill()
            .args(["models", "list"])
            .args(args)
            .env("RILL_MODELS_DIR", dir.path())
            .env("HF_HOME", dir.path().join("hf")));
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        out
    };
    let listed: serde_json::Value = serde_json::from_str(&list(&["--json"])).unwrap();
    let by_name = |n: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == n)
            .unwrap_or_else(|| panic!("{n} not listed: {listed}"))
            .clone()
    };
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    let broken = by_name("broken");
    assert!(
        broken["error"]
            .as_str()
            .unwrap()
            .contains("its chat template fails"),
        "{broken}"
    );
    assert_eq!(broken["runs"], false);
    // Templates that compile are not run by listing: they list as the models they claim to be.
    for n in ["endless", "selfish"] {
        let m = by_name(n);
        assert!(m["error"].is_null() && m["runs"] == true, "{m}");
    }
    let real = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().unwrap().ends_with("real.gguf"))
        .unwrap();
    assert!(
        real["error"].is_null() && real["quantization"] == "Q4_1",
        "{real}"
    );
    // The table says it in words.
    let table = list(&[]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("broken") && l.contains("cannot be used: ")),
        "{table}"
    );
    assert!(table.contains("real.gguf"), "{table}");
}

#[test]
fn running_a_model_whose_template_fails_is_one_clear_error() {
    // The engine's tests load crafted models with hostile templates; here the whole command:
    // a file with no weights is refused before its template is read, saying so.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("endless.gguf");
    std::fs::write(
        &p,
        header_only(&[
            ("general.architecture", "llama"),
            (
                "tokenizer.chat_template",
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            ),
        ]),
    )
    .unwrap();
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["run", "--model", p.to_str().unwrap(), "--prompt", "Hi"])
        .env("RILL_LOG", "off")
        .output()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_clean_error(&out, "endless.gguf");
}
