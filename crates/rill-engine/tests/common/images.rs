//! The image tests' shared parts (issue 42): llama.cpp's test picture and ours, the recorded
//! references (`scripts/record-reference-images.py`), and the comparisons with them.

use std::path::{Path, PathBuf};

use rill_engine::model::decoder::Injected;
use rill_engine::model::{KvCache, Model};
use rill_engine::vision::{ImageRows, Picture, Projector};
use sha2::Digest;

/// How far the first step's top logits may be from llama.cpp's: 0.05 to 0.2 when this was
/// written (the text model's 8-bit activations round a few values apart); a part of the
/// model wrong puts them 1 to 2.3 apart: Gemma 4's image rows read causally instead of both
/// ways (2.2), Qwen3-VL's deepstack rows left out (2.3), or its rows at their slots instead of
/// their M-RoPE positions (1.0).
const FIRST_LOGITS: f64 = 0.4;

/// The error loading `craft` (a projector file made bad on purpose) gives, written to `path`.
pub fn load_error(craft: super::gguf_craft::Craft, path: &Path) -> String {
    std::fs::write(path, craft.bytes()).unwrap();
    Projector::load(path)
        .err()
        .expect("a bad file loaded")
        .to_string()
}

/// The reference recorded for projector `name` (a file stem of the test models).
pub fn reference(projector: &str) -> serde_json::Value {
    super::parity::reference(&format!("{projector}.image"))
}

/// llama.cpp's `tools/mtmd/test-1.jpeg` (640 × 488), beside the assets' `models/` folder.
pub fn test_image() -> PathBuf {
    super::llama_cpp_assets().join("../tools/mtmd/test-1.jpeg")
}

/// A picture of `tests/fixtures/images/`.
pub fn fixture_image(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name)
}

/// The two pictures every reference holds, by their names there.
pub fn pictures() -> [(&'static str, PathBuf); 2] {
    [
        ("shapes.png", fixture_image("shapes.png")),
        ("test-1.jpeg", test_image()),
    ]
}

pub fn sha256(path: &Path) -> String {
    format!("{:x}", sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `‖a − b‖² / ‖b‖²`.
pub fn normalised_mse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    num / den
}

/// The projector the reference `r` was recorded on, its bytes checked.
pub fn projector(r: &serde_json::Value) -> Projector {
    let name = r["projector"].as_str().unwrap();
    let path = super::test_model(name.trim_end_matches(".gguf"));
    assert_eq!(
        sha256(&path),
        r["projector_sha256"],
        "{name} is not the file the reference was recorded on: regenerate both scripts' outputs"
    );
    Projector::load(&path).unwrap()
}

/// The rows llama.cpp made of `image` (a key of the reference's `images`).
pub fn reference_rows(r: &serde_json::Value, image: &str) -> Vec<f32> {
    r["images"][image]["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(super::parity::floats)
        .map(|v| v as f32)
        .collect()
}

/// `image`'s rows (named `name` in the reference) and their normalised MSE against
/// llama.cpp's; the rows are checked to differ from each other and to repeat bit for bit.
pub fn rows_against_llama_cpp(
    r: &serde_json::Value,
    projector: &Projector,
    image: &Path,
    name: &str,
) -> (ImageRows, f64) {
    assert_eq!(sha256(image), r["images"][name]["sha256"], "{name}");
    let picture = Picture::decode(&std::fs::read(image).unwrap()).unwrap();
    let rows = projector.encode(&picture).unwrap();
    let want = reference_rows(r, name);
    assert_eq!(rows.values.len(), want.len(), "{name}: rows");
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
    (rows, mse)
}

/// Both pictures through `projector` at their own size: as many rows as mtmd made of each,
/// within a normalised MSE of 1e-4 of its rows on the PNG (Pillow's resampling, then rounding
/// only) and 1e-3 on the photo (the JPEG decoders' few levels besides).
pub fn own_size_rows_match(r: &serde_json::Value, projector: &Projector) {
    for (name, image) in pictures() {
        let (rows, mse) = rows_against_llama_cpp(r, projector, &image, name);
        let parts = &r["images"][name]["parts"];
        assert_eq!(Some(rows.rows as u64), parts[1]["image"].as_u64());
        let bound = if name.ends_with(".png") { 1e-4 } else { 1e-3 };
        assert!(
            mse <= bound,
            "{name} of {}: normalised MSE {mse}",
            r["projector"]
        );
    }
}

/// The reference's prompt as ids, the image's rows as placeholders (0), and where they start.
pub fn prompt_ids(parts: &serde_json::Value) -> (Vec<u32>, usize) {
    let (mut ids, mut at) = (Vec::new(), 0);
    for part in parts.as_array().unwrap() {
        match part.get("tokens") {
            Some(t) => ids.extend(super::parity::ids(t)),
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

/// The greedy answer to the reference's question about `name`, llama.cpp's choice fed back at
/// each step, checked step by step against llama.cpp's (a near-tie of its own may go either
/// way); returns ours and how many steps agree.
pub fn answer_against_llama_cpp(
    r: &serde_json::Value,
    model: &Model,
    rows: &ImageRows,
    name: &str,
    both_ways: bool,
) -> (Vec<u32>, usize) {
    let want = &r["images"][name];
    let (ids, at) = prompt_ids(&want["parts"]);
    let mut cache = KvCache::new();
    let inject = [Injected {
        seq: 0,
        at,
        rows: &rows.values,
        both_ways,
        grid: (rows.nx, rows.ny),
    }];
    let mut logits = model
        .weights
        .forward_rows_with(&mut [(&ids, &mut cache)], &[1], &inject)
        .unwrap()
        .remove(0);
    // Where the reference keeps the first step's highest logits, they are held closer than
    // the greedy choice can be: a part of the model that moves them by tenths (the image rows
    // read one way where llama.cpp reads them both ways) leaves most answers alone.
    if let Some(top) = want["first_logits"].as_array() {
        let off = top
            .iter()
            .map(|p| {
                let (id, v) = (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap());
                (f64::from(logits[id]) - v).abs()
            })
            .fold(0.0, f64::max);
        eprintln!("{name}: the first step's top logits within {off:.4} of llama.cpp's");
        assert!(
            off < FIRST_LOGITS,
            "{name}: first logits {off} from llama.cpp's"
        );
    }
    let greedy = super::parity::ids(&want["greedy"]);
    let gaps = super::parity::floats(&want["greedy_gaps"]);
    let (mut ours, mut same) = (Vec::new(), 0);
    for (step, (&theirs, &gap)) in greedy.iter().zip(&gaps).enumerate() {
        let mine = super::parity::argmax(&logits);
        ours.push(mine);
        same += usize::from(mine == theirs);
        assert!(
            mine == theirs || gap < f64::from(super::parity::NEAR_TIE),
            "{name}: step {step}: {mine} where llama.cpp chose {theirs} (its gap {gap})"
        );
        logits = model.weights.forward(&[theirs], &mut cache).unwrap();
    }
    eprintln!(
        "{name}: {same} of {} greedy steps as llama.cpp's",
        greedy.len()
    );
    (ours, same)
}
