//! Gemma 4's images (issue 42): the test projector (`scripts/make-test-projectors.py`: the
//! encoder with seeded random weights, position tables by column and row, q/k norms and
//! unscaled scores, post-norms, output scales, clamped matrices, 3 × 3 pooling and the
//! standardisation) turns llama.cpp's test photo and our PNG into the rows llama.cpp's `mtmd`
//! made of them, at their own sizes, and the test model (`gemma4v`) answers a question about
//! each as llama.cpp does, the image's rows attending to each other both ways.

mod common;

use common::images::{answer_against_llama_cpp, pictures, sha256};
use rill_engine::model::Model;

const PROJECTOR: &str = "gemma4-mmproj-test.F16";

#[test]
fn pictures_become_llama_cpps_rows_at_their_own_size() {
    let r = common::images::reference(PROJECTOR);
    let projector = common::images::projector(&r);
    assert_eq!(projector.text_width(), 128);
    // Whole 48-pixel units (16-pixel patches pooled 3 × 3) at the picture's aspect ratio:
    // 640 × 488 → 13 × 10 tokens; 300 × 200 would be 6 × 4, under Gemma 4's least of 70
    // tokens, so it is scaled up to 11 × 7, as mtmd sized them.
    assert_eq!(projector.grid(640, 488), (13, 10));
    assert_eq!(projector.grid(300, 200), (11, 7));
    // At most 1,120 tokens.
    let (nx, ny) = projector.grid(8000, 6000);
    assert!(nx * ny <= 1120 && nx * ny > 1000, "{nx} × {ny}");
    common::images::own_size_rows_match(&r, &projector);
}

#[test]
fn a_picture_past_the_position_tables_is_an_error_not_a_crash() {
    let r = common::images::reference(PROJECTOR);
    let projector = common::images::projector(&r);
    // 3,000 × 60 pixels keep their shape within 1,120 tokens: 62 × 1 units, 186 patches a
    // row, past the test file's tables of 64 positions.
    let mut png = Vec::new();
    image::RgbImage::new(3000, 60)
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let picture = rill_engine::vision::Picture::decode(&png).unwrap();
    let err = projector.encode(&picture).err().unwrap().to_string();
    assert!(err.contains("positions a side"), "{err}");
}

#[test]
fn a_question_about_a_picture_gets_llama_cpps_answer() {
    let r = common::images::reference(PROJECTOR);
    let path = common::test_model("gemma4v-test.Q8_0");
    assert_eq!(sha256(&path), r["model_sha256"]);
    let model = Model::load(&path, &candle_core::Device::Cpu, None).unwrap();
    let projector = common::images::projector(&r);
    // The markers around the image are Gemma 4's own tokens, as mtmd split the prompt (after
    // its BOS).
    let prompt = r["prompt"].as_str().unwrap();
    let (before, _) = prompt.split_once("<__media__>").unwrap();
    let encode = |t: &str| model.tokenizer.encode_with(t, false).unwrap();
    let parts = &r["images"]["shapes.png"]["parts"];
    let bos = model.tokenizer.encode_with(before, true).unwrap();
    let first = [bos, encode("<|image>")].concat();
    assert_eq!(first, common::parity::ids(&parts[0]["tokens"]));
    let mut answers = Vec::new();
    for (name, image) in pictures() {
        let picture = rill_engine::vision::Picture::decode(&std::fs::read(image).unwrap());
        let rows = projector.encode(&picture.unwrap()).unwrap();
        let (ours, same) = answer_against_llama_cpp(&r, &model, &rows, name, true);
        assert!(same >= 20, "{name}: {same} of 24 steps as llama.cpp's");
        answers.push(ours);
    }
    assert_ne!(answers[0], answers[1]);
}

#[test]
fn a_bad_gemma_4_projector_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    let good = || common::gguf_craft::read(&common::test_model(PROJECTOR));
    let load = |craft| common::images::load_error(craft, &path);
    let tensor = |craft: &common::gguf_craft::Craft, name: &str| {
        craft.tensors.iter().position(|t| t.name == name).unwrap()
    };
    // The position tables as one table of twice the rows: not Gemma 4's two.
    let mut craft = good();
    let at = tensor(&craft, "v.position_embd.weight");
    craft.tensors[at].dims = vec![96, 128];
    let err = load(craft);
    assert!(
        err.contains("v.position_embd.weight") && err.contains("[2, positions, 96]"),
        "{err}"
    );
    // Clamp bounds the wrong way round (a minimum above the maximum of 1.5).
    let mut craft = good();
    let at = tensor(&craft, "v.blk.1.attn_q.input_min");
    craft.tensors[at].data = 5f32.to_le_bytes().to_vec();
    let err = load(craft);
    assert!(
        err.contains("v.blk.1.attn_q") && err.contains("wrong way round"),
        "{err}"
    );
    // A bound that is not a number.
    let mut craft = good();
    let at = tensor(&craft, "v.blk.0.ffn_down.output_max");
    craft.tensors[at].data = f32::NAN.to_le_bytes().to_vec();
    let err = load(craft);
    assert!(err.contains("not finite"), "{err}");
    // One of the standardisation's two vectors alone.
    let mut craft = good();
    craft.tensors.retain(|t| t.name != "v.std_scale");
    let err = load(craft);
    assert!(err.contains("v.std_bias"), "{err}");
}
