//! Images (issue 42): the test projector (`scripts/make-test-projectors.py`, Gemma 3's SigLIP
//! with seeded random weights) turns llama.cpp's own test picture into the rows llama.cpp's
//! `mtmd` made of it (recorded by `scripts/record-reference-images.py`), and a bad projector
//! file or a bad image is a named error.

mod common;

use std::path::PathBuf;

use candle_core::quantized::gguf_file::Value;
use rill_engine::vision::{ImageError, Picture, Projector};
use sha2::Digest;

const PROJECTOR: &str = "gemma3-mmproj-test.F16";

fn reference() -> serde_json::Value {
    common::parity::reference(&format!("{PROJECTOR}.image"))
}

/// llama.cpp's `tools/mtmd/test-1.jpeg` (640 × 488), beside the assets' `models/` folder.
fn test_image() -> PathBuf {
    common::llama_cpp_assets().join("../tools/mtmd/test-1.jpeg")
}

/// A picture of `tests/fixtures/images/`.
fn fixture_image(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name)
}

fn sha256(path: &std::path::Path) -> String {
    format!("{:x}", sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `‖a − b‖² / ‖b‖²`.
fn normalised_mse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    num / den
}

/// The rows llama.cpp made of `image` (a key of the reference's `images`).
fn reference_rows(r: &serde_json::Value, image: &str) -> Vec<f32> {
    r["images"][image]["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(common::parity::floats)
        .map(|v| v as f32)
        .collect()
}

/// `image`'s rows and their normalised MSE against llama.cpp's.
fn rows_against_llama_cpp(projector: &Projector, image: &std::path::Path, name: &str) -> f64 {
    let r = reference();
    assert_eq!(sha256(image), r["images"][name]["sha256"], "{name}");
    let picture = Picture::decode(&std::fs::read(image).unwrap()).unwrap();
    let rows = projector.encode(&picture).unwrap();
    let want = reference_rows(&r, name);
    assert_eq!((rows.rows, rows.values.len()), (16, want.len()));
    // Each row is its own part of the picture: the rows are not all alike.
    let (first, other) = (
        &rows.values[..rows.width],
        &rows.values[5 * rows.width..][..rows.width],
    );
    assert!(normalised_mse(first, other) > 0.1);
    // The same picture again gives the same bits.
    assert_eq!(projector.encode(&picture).unwrap(), rows);
    let mse = normalised_mse(&rows.values, &want);
    eprintln!("{name}: image rows at normalised MSE {mse:.2e} from llama.cpp's");
    mse
}

fn projector() -> Projector {
    let path = common::test_model(PROJECTOR);
    assert_eq!(
        sha256(&path),
        reference()["projector_sha256"],
        "{PROJECTOR} is not the file the reference was recorded on: regenerate both scripts' outputs"
    );
    Projector::load(&path).unwrap()
}

#[test]
fn a_png_becomes_llama_cpps_image_rows() {
    let projector = projector();
    assert_eq!(projector.tokens_per_image(), 16);
    assert_eq!(projector.text_width(), 128);
    // Lossless pixels, resampled as Pillow and llama.cpp do: only the arithmetic's rounding
    // is left (2.8e-6 when this was written).
    let mse = rows_against_llama_cpp(&projector, &fixture_image("shapes.png"), "shapes.png");
    assert!(mse <= 1e-5, "normalised MSE {mse}");
}

#[test]
fn llama_cpps_test_photo_becomes_its_image_rows() {
    let projector = projector();
    let image = test_image();
    let picture = Picture::decode(&std::fs::read(&image).unwrap()).unwrap();
    assert_eq!((picture.width(), picture.height()), (640, 488));
    // JPEG decoders may round a few levels apart (the spec allows it: `image`'s and
    // llama.cpp's stb_image differ on 9% of this photo's values, by up to 4), which leaves
    // 2.1e-4 here; the bound is 1e-3.
    let mse = rows_against_llama_cpp(&projector, &image, "test-1.jpeg");
    assert!(mse <= 1e-3, "normalised MSE {mse}");
}

#[test]
fn a_model_file_is_not_a_projector_and_a_bad_one_is_named() {
    let model = common::test_model("gemma3-test.Q8_0");
    let err = Projector::load(&model).err().unwrap().to_string();
    assert!(err.contains("not a projector file"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let good = common::gguf_craft::read(&common::test_model(PROJECTOR));
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "clip.projector_type",
            Value::String("qwen25vl_x".into()),
            "not one Rill runs",
        ),
        (
            "clip.vision.embedding_length",
            Value::U32(98),
            "whole number of its 4 heads",
        ),
        (
            "clip.vision.embedding_length",
            Value::U32(128),
            "v.patch_embd.weight",
        ),
        (
            "clip.vision.block_count",
            Value::U32(4),
            "v.blk.3.ln1.weight",
        ),
        ("clip.vision.block_count", Value::U32(1 << 30), "1 to 256"),
        (
            "clip.vision.patch_size",
            Value::U32(15),
            "whole number of 15-pixel patches",
        ),
        (
            "clip.vision.projector.scale_factor",
            Value::U32(3),
            "pool 3 × 3",
        ),
        (
            "clip.vision.image_std",
            Value::Array(vec![Value::F32(0.0); 3]),
            "not finite and positive",
        ),
        (
            "clip.vision.image_mean",
            Value::Array(vec![Value::F32(0.5)]),
            "at least three",
        ),
        (
            "clip.vision.attention.layer_norm_epsilon",
            Value::F32(f32::NAN),
            "(0, 1)",
        ),
        (
            "clip.vision.projection_dim",
            Value::U32(64),
            "mm.input_projection.weight",
        ),
        (
            "clip.has_vision_encoder",
            Value::Bool(false),
            "no vision encoder",
        ),
    ];
    for (key, value, want) in cases {
        let mut craft = common::gguf_craft::read(&common::test_model(PROJECTOR));
        common::gguf_craft::set(&mut craft, key, value);
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, craft.bytes()).unwrap();
        let err = Projector::load(&path).err().expect(key).to_string();
        assert!(
            err.contains(want) && err.contains("bad.gguf"),
            "{key}: {err}"
        );
    }
    // A missing tensor, a truncated file.
    let mut craft = common::gguf_craft::read(&common::test_model(PROJECTOR));
    craft.tensors.retain(|t| t.name != "v.blk.1.attn_k.weight");
    let path = dir.path().join("missing.gguf");
    std::fs::write(&path, craft.bytes()).unwrap();
    let err = Projector::load(&path).err().unwrap().to_string();
    assert!(
        err.contains("v.blk.1.attn_k.weight") && err.contains("missing"),
        "{err}"
    );
    let bytes = good.bytes();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let err = Projector::load(&path).err().unwrap().to_string();
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_file_that_is_not_an_image_is_a_named_error() {
    let model = std::fs::read(common::test_model("gemma3-test.Q8_0")).unwrap();
    assert_eq!(
        Picture::decode(&model[..4096]).unwrap_err(),
        ImageError::UnknownFormat
    );
    // A photo cut before its frame header: its format is known, its size is not.
    let jpeg = std::fs::read(test_image()).unwrap();
    let err = Picture::decode(&jpeg[..100]).unwrap_err();
    assert!(
        matches!(err, ImageError::Damaged { ref format, .. } if format == "JPEG"),
        "{err}"
    );
    let png = std::fs::read(fixture_image("shapes.png")).unwrap();
    let err = Picture::decode(&png[..png.len() / 2]).unwrap_err();
    assert!(
        matches!(err, ImageError::Damaged { ref format, .. } if format == "PNG"),
        "{err}"
    );
}

/// The reference's prompt as ids, the image's rows as placeholders (0), and where they start.
fn prompt_ids(parts: &serde_json::Value) -> (Vec<u32>, usize) {
    let (mut ids, mut at) = (Vec::new(), 0);
    for part in parts.as_array().unwrap() {
        match part.get("tokens") {
            Some(t) => ids.extend(common::parity::ids(t)),
            None => {
                at = ids.len();
                ids.extend(std::iter::repeat_n(
                    0,
                    part["image"].as_u64().unwrap() as usize,
                ));
            }
        }
    }
    (ids, at)
}

#[test]
fn a_question_about_a_picture_gets_llama_cpps_answer() {
    use rill_engine::model::decoder::Injected;
    use rill_engine::model::{KvCache, Model};
    let r = reference();
    let path = common::test_model("gemma3v-test.Q8_0");
    assert_eq!(sha256(&path), r["model_sha256"]);
    let model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
    let projector = projector();
    // The text around the image tokenizes as mtmd split it: the turn up to the image, its
    // opening marker, then its closing marker and the rest, each piece on its own.
    let prompt = r["prompt"].as_str().unwrap();
    let (before, after) = prompt.split_once("<__media__>").unwrap();
    let parts = &r["images"]["shapes.png"]["parts"];
    let encode = |t: &str| model.tokenizer.encode_with(t, false).unwrap();
    let first = [
        vec![model.tokenizer.bos_id().unwrap()],
        encode(before),
        encode("<start_of_image>"),
    ];
    assert_eq!(first.concat(), common::parity::ids(&parts[0]["tokens"]));
    let last = [encode("<end_of_image>"), encode(after)].concat();
    assert_eq!(last, common::parity::ids(&parts[2]["tokens"]));
    let images = [
        ("shapes.png", fixture_image("shapes.png")),
        ("test-1.jpeg", test_image()),
    ];
    let mut answers = Vec::new();
    for (name, image) in images {
        let want = &r["images"][name];
        let rows = projector
            .encode(&Picture::decode(&std::fs::read(image).unwrap()).unwrap())
            .unwrap();
        let (ids, at) = prompt_ids(&want["parts"]);
        let mut cache = KvCache::new();
        let inject = [Injected {
            seq: 0,
            at,
            rows: &rows.values,
            both_ways: true,
        }];
        let mut logits = model
            .weights
            .forward_rows_with(&mut [(&ids, &mut cache)], &[1], &inject)
            .unwrap()
            .remove(0);
        let greedy = common::parity::ids(&want["greedy"]);
        let gaps = common::parity::floats(&want["greedy_gaps"]);
        let (mut ours, mut same) = (Vec::new(), 0);
        for (step, (&theirs, &gap)) in greedy.iter().zip(&gaps).enumerate() {
            let mine = common::parity::argmax(&logits);
            ours.push(mine);
            // Where llama.cpp's own top two were within a near-tie, either is its answer, and
            // the comparison goes on from its choice.
            same += usize::from(mine == theirs);
            assert!(
                mine == theirs || gap < f64::from(common::parity::NEAR_TIE),
                "{name}: step {step}: {mine} where llama.cpp chose {theirs} (its gap {gap})"
            );
            logits = model.weights.forward(&[theirs], &mut cache).unwrap();
        }
        eprintln!(
            "{name}: {same} of {} greedy steps as llama.cpp's",
            greedy.len()
        );
        answers.push(ours);
    }
    // The answer is about the picture: another picture, another answer.
    assert_ne!(answers[0], answers[1]);
}
