//! Images from the command line and the API (issue 42): `rill run --image` and the official
//! `openai` client sending a base64 image to `rill serve` (`tests/api_images.py`) give the same
//! answer about llama.cpp's test photo, on the Gemma 3 test model with its test projector.

use std::process::Command;

mod common;
use common::{ok, rill, run_events, test_model, Server};

fn photo() -> std::path::PathBuf {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/llama-cpp-source.sh"
        ))
        .output()
        .unwrap();
    let src = String::from_utf8(out.stdout).unwrap();
    std::path::PathBuf::from(src.trim()).join("tools/mtmd/test-1.jpeg")
}

#[test]
fn run_and_the_openai_client_answer_the_same_about_a_photo() {
    let (model, projector) = (
        test_model("gemma3v-test.Q8_0"),
        test_model("gemma3-mmproj-test.F16"),
    );
    let (model, projector) = (model.to_str().unwrap(), projector.to_str().unwrap());
    let photo = photo();
    let out = ok(rill().args([
        "run",
        "--model",
        model,
        "--mmproj",
        projector,
        "--image",
        photo.to_str().unwrap(),
        "--prompt",
        "What is in this picture?",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--json",
    ]));
    let (_, text, done) = run_events(&out);
    assert!(
        done["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{out}"
    );
    // The image's 16 rows and their markers are prompt tokens.
    assert!(
        done["usage"]["prompt_tokens"].as_u64().unwrap() > 16,
        "{out}"
    );

    let server = Server::start_with(&test_model("gemma3v-test.Q8_0"), &["--mmproj", projector]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/api_images.py");
    let api = Command::new("python3")
        .args([script, &server.base, photo.to_str().unwrap()])
        .output()
        .expect("python3 runs (scripts/install-deps.sh installs openai)");
    let stdout = String::from_utf8_lossy(&api.stdout);
    assert!(
        api.status.success(),
        "tests/api_images.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&api.stderr)
    );
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["content"], text.as_str());
}

#[test]
fn an_image_the_model_cannot_read_is_a_one_line_error() {
    let photo = photo();
    // SmolLM2 has no projector.
    let out = rill()
        .args([
            "run",
            "--model",
            common::model().to_str().unwrap(),
            "--image",
        ])
        .arg(&photo)
        .args(["--prompt", "What is this?", "--max-tokens", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no vision projector"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A file that is not an image.
    let model = test_model("gemma3v-test.Q8_0");
    let out = rill()
        .args(["run", "--model", model.to_str().unwrap(), "--mmproj"])
        .arg(test_model("gemma3-mmproj-test.F16"))
        .args([
            "--image",
            model.to_str().unwrap(),
            "--prompt",
            "What is this?",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("image:"), "{err}");
}

#[test]
fn a_qwen_vl_model_reads_each_picture_at_its_own_size() {
    let (model, projector) = (
        test_model("qwen2vl-test.Q8_0"),
        test_model("qwen25vl-mmproj-test.F16"),
    );
    let shapes = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rill-engine/tests/fixtures/images/shapes.png"
    );
    let photo = photo();
    let prompt_tokens = |image: &str| {
        let out = ok(rill().args([
            "run",
            "--model",
            model.to_str().unwrap(),
            "--mmproj",
            projector.to_str().unwrap(),
            "--image",
            image,
            "--prompt",
            "What is in this picture?",
            "--temperature",
            "0",
            "--max-tokens",
            "4",
            "--json",
        ]));
        let (_, text, done) = run_events(&out);
        assert!(!text.is_empty(), "{out}");
        done["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    // The photo (640 × 488) is 23 × 17 image tokens, the PNG (300 × 200) 11 × 7: the same
    // question around them.
    let (big, small) = (
        prompt_tokens(photo.to_str().unwrap()),
        prompt_tokens(shapes),
    );
    assert_eq!(big - small, 23 * 17 - 11 * 7);
}
