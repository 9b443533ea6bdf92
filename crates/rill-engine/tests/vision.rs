//! Images (issue 42): the test projector (`scripts/make-test-projectors.py`, Gemma 3's SigLIP
//! with seeded random weights) turns llama.cpp's own test picture into the rows llama.cpp's
//! `mtmd` made of it (recorded by `scripts/record-reference-images.py`), and a bad projector
//! file or a bad image is a named error.

mod common;

use candle_core::quantized::gguf_file::Value;
use common::images::{
    answer_against_llama_cpp, fixture_image, pictures, rows_against_llama_cpp, sha256, test_image,
};
use rill_engine::vision::{ImageError, Picture, Projector};

const PROJECTOR: &str = "gemma3-mmproj-test.F16";

fn reference() -> serde_json::Value {
    common::images::reference(PROJECTOR)
}

fn projector() -> Projector {
    common::images::projector(&reference())
}

#[test]
fn a_png_becomes_llama_cpps_image_rows() {
    let projector = projector();
    // Gemma 3 reads every image as the same square: 4 × 4 rows whatever its shape.
    assert_eq!(projector.grid(640, 488), (4, 4));
    assert_eq!(projector.text_width(), 128);
    // Lossless pixels, resampled as Pillow and llama.cpp do: only the arithmetic's rounding
    // is left (2.8e-6 when this was written).
    let (rows, mse) = rows_against_llama_cpp(
        &reference(),
        &projector,
        &fixture_image("shapes.png"),
        "shapes.png",
    );
    assert_eq!(rows.rows, 16);
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
    let (_, mse) = rows_against_llama_cpp(&reference(), &projector, &image, "test-1.jpeg");
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

#[test]
fn a_question_about_a_picture_gets_llama_cpps_answer() {
    use rill_engine::model::Model;
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
    let mut answers = Vec::new();
    for (name, image) in pictures() {
        let rows = projector
            .encode(&Picture::decode(&std::fs::read(image).unwrap()).unwrap())
            .unwrap();
        answers.push(answer_against_llama_cpp(&r, &model, &rows, name, true).0);
    }
    // The answer is about the picture: another picture, another answer.
    assert_ne!(answers[0], answers[1]);
}
