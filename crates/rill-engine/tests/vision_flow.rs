//! Images in the flow (issue 42): a question about a picture through the engine, as any
//! request goes — chunked prefill that takes an image whole, beside another answer, prefix
//! reuse for a follow-up, the projector found beside its model — and the errors a user meets
//! (no projector, one of another model, a file that is not an image).

mod common;

use std::path::{Path, PathBuf};

use rill_engine::{
    Engine, EngineConfig, Error, Event, GenerateRequest, ImageData, Message, SamplingParams,
};

const MODEL: &str = "gemma3v-test.Q8_0";
const PROJECTOR: &str = "gemma3-mmproj-test.F16";
const QUESTION: &str = "What is in this picture?";

fn photo() -> ImageData {
    let path = common::llama_cpp_assets().join("../tools/mtmd/test-1.jpeg");
    ImageData::new(std::fs::read(path).unwrap())
}

fn shapes() -> ImageData {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/shapes.png");
    ImageData::new(std::fs::read(path).unwrap())
}

fn engine_with(model: &Path, projector: Option<&Path>, chunk: usize) -> Engine {
    let mut config = EngineConfig::new(model);
    config.projector = projector.map(Path::to_owned);
    config.prefill_chunk = chunk;
    config.threads = Some(2);
    Engine::start(config).unwrap()
}

/// An engine on test model `model` with test projector `projector`, prefilling `chunk` at a time.
fn paired(model: &str, projector: &str, chunk: usize) -> Engine {
    engine_with(
        &common::test_model(model),
        Some(&common::test_model(projector)),
        chunk,
    )
}

fn engine(chunk: usize) -> Engine {
    paired(MODEL, PROJECTOR, chunk)
}

fn asking(image: ImageData, question: &str) -> Message {
    Message {
        images: vec![image],
        ..Message::user(question)
    }
}

fn greedy(messages: Vec<Message>, n: usize) -> GenerateRequest {
    GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(n),
        ignore_eos: true,
        ..GenerateRequest::chat(messages)
    }
}

/// The answer's ids and the prompt tokens it reused.
fn answer(engine: &Engine, req: GenerateRequest) -> (Vec<u32>, usize) {
    let (mut ids, mut reused) = (Vec::new(), 0);
    for ev in engine.handle().generate(req).unwrap() {
        match ev {
            Event::Started { reused_tokens, .. } => reused = reused_tokens,
            Event::Token { id, .. } => ids.push(id),
            Event::Error { message } => panic!("{message}"),
            _ => {}
        }
    }
    (ids, reused)
}

#[test]
fn a_question_about_a_photo_streams_llama_cpps_answer_in_chunks_beside_another() {
    let r = common::parity::reference(&format!("{PROJECTOR}.image"));
    let want = common::parity::ids(&r["images"]["test-1.jpeg"]["greedy"]);
    // Chunks of 8 tokens: the image's 16 rows must go in one of their own.
    let engine = engine(8);
    assert!(engine.handle().reads_images());
    // Another answer streams while the picture's question is prefilled.
    let other = engine
        .handle()
        .generate(greedy(vec![Message::user("Tell me a long story.")], 60))
        .unwrap();
    let (ids, _) = answer(&engine, greedy(vec![asking(photo(), QUESTION)], want.len()));
    assert_eq!(ids, want, "the engine's answer about test-1.jpeg");
    let rest = other.collect_blocking().unwrap();
    assert_eq!(rest.ids.len(), 60);
    // The same question about another picture has another answer.
    let (other_ids, _) = answer(
        &engine,
        greedy(vec![asking(shapes(), QUESTION)], want.len()),
    );
    assert_ne!(other_ids, ids);
}

#[test]
fn a_follow_up_about_the_same_picture_reuses_its_rows_and_its_cache() {
    let engine = engine(256);
    let first = vec![asking(photo(), QUESTION)];
    let (said, _) = answer(&engine, greedy(first.clone(), 12));
    assert_eq!(engine.handle().images_encoded(), 1);
    let text = engine.handle().tokenizer().decode(&said);
    let mut follow = first;
    follow.push(Message::assistant(text));
    follow.push(Message::user("And what colour is it?"));
    let (_, reused) = answer(&engine, greedy(follow, 4));
    // The whole first turn, picture included, came from the kept cache, and the picture was
    // not encoded again.
    let image_end = 1 + 10 + 7 + 16;
    assert!(reused > image_end, "reused {reused} tokens");
    assert_eq!(engine.handle().images_encoded(), 1);
}

#[test]
fn the_projector_beside_its_model_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gemma3v-test-Q8_0.gguf");
    std::fs::copy(common::test_model(MODEL), &model).unwrap();
    let engine = engine_with(&model, None, 256);
    assert!(!engine.handle().reads_images());
    drop(engine);
    std::fs::copy(
        common::test_model(PROJECTOR),
        dir.path().join("mmproj-gemma3v-test-F16.gguf"),
    )
    .unwrap();
    let engine = engine_with(&model, None, 256);
    assert!(engine.handle().reads_images());
    let path = engine.handle().projector_path().unwrap().to_owned();
    assert!(path.ends_with("mmproj-gemma3v-test-F16.gguf"), "{path:?}");
}

#[test]
fn an_image_a_model_cannot_read_is_a_clear_error_and_the_engine_goes_on() {
    // No projector: the image is refused by name.
    let plain = engine_with(&common::model_path(), None, 256);
    let err = plain
        .handle()
        .generate(greedy(vec![asking(photo(), QUESTION)], 4))
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Image(m) if m.contains("no vision projector")),
        "{err}"
    );
    // A projector of another model (rows 128 wide; SmolLM2's are 576).
    let mut config = EngineConfig::new(common::model_path());
    config.projector = Some(common::test_model(PROJECTOR));
    let err = Engine::start(config).err().unwrap().to_string();
    assert!(err.contains("belongs to another model"), "{err}");
    // Bytes that are not an image, then a question that is fine: the engine answers it.
    let engine = engine(256);
    let err = engine
        .handle()
        .generate(greedy(
            vec![asking(ImageData::new(b"not an image".to_vec()), QUESTION)],
            4,
        ))
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Image(m) if m.contains("JPEG, PNG and WebP")),
        "{err}"
    );
    let (ids, _) = answer(&engine, greedy(vec![asking(shapes(), QUESTION)], 4));
    assert_eq!(ids.len(), 4);
}

/// The answer to `first` (12 tokens) on `model` with `projector`: in one step, then in chunks
/// of 16 beside another answer (the picture's rows whole in one of them), which must be the
/// same; returns the engine that answered in chunks and its answer.
fn same_in_chunks(model: &str, projector: &str, first: &[Message]) -> (Engine, Vec<u32>) {
    let (whole, _) = answer(&paired(model, projector, 4096), greedy(first.to_vec(), 12));
    let engine = paired(model, projector, 16);
    let other = engine
        .handle()
        .generate(greedy(vec![Message::user("Tell me a long story.")], 40))
        .unwrap();
    let (ids, _) = answer(&engine, greedy(first.to_vec(), 12));
    assert_eq!(ids, whole, "{model}: in chunks");
    assert_eq!(other.collect_blocking().unwrap().ids.len(), 40);
    (engine, ids)
}

/// A follow-up to `first` (answered `said`) on `engine` reuses the cache past the picture's
/// `rows` and answers as a fresh engine answers the whole conversation.
fn follow_up_as_fresh(
    engine: &Engine,
    fresh: Engine,
    first: &[Message],
    said: &[u32],
    rows: usize,
) {
    let mut follow = first.to_vec();
    follow.push(Message::assistant(engine.handle().tokenizer().decode(said)));
    follow.push(Message::user("And what colour is it?"));
    let (again, reused) = answer(engine, greedy(follow.clone(), 8));
    assert!(reused > rows, "reused {reused} tokens");
    let (fresh, reused) = answer(&fresh, greedy(follow, 8));
    assert_eq!(reused, 0);
    assert_eq!(again, fresh);
}

#[test]
fn qwen_vl_answers_in_the_flow_and_a_follow_up_goes_on_from_m_rope_positions() {
    // (llama.cpp's answers are checked in `vision_qwen.rs` on mtmd's prompt; the engine's
    // prompt is the chat template's, whose default system message mtmd's has not.)
    let (model, projector) = ("qwen2vl-test.Q8_0", "qwen25vl-mmproj-test.F16");
    let first = vec![asking(shapes(), QUESTION)];
    // In chunks of 16: the text before the picture in steps of its own, the picture's 77 rows
    // (11 × 7) whole in one, the text after at positions that go on from the picture's 11.
    let (engine, ids) = same_in_chunks(model, projector, &first);
    // The cache keeps the picture's positions with it.
    follow_up_as_fresh(&engine, paired(model, projector, 256), &first, &ids, 77);
    // Another picture, another answer.
    let (photo_ids, _) = answer(&engine, greedy(vec![asking(photo(), QUESTION)], 12));
    assert_ne!(photo_ids, ids);
}

#[test]
fn gemma_4_answers_in_the_flow_whole_or_in_chunks_beside_another() {
    // (llama.cpp's answers are checked in `vision_gemma4.rs` on mtmd's prompt; the engine's
    // is Gemma 4's template's, which closes an empty thought channel after `<|turn>model`.)
    // The photo's 130 rows (13 × 10) go in whole, both ways among themselves.
    let first = vec![asking(photo(), QUESTION)];
    let (engine, ids) = same_in_chunks("gemma4v-test.Q8_0", "gemma4-mmproj-test.F16", &first);
    let (shapes_ids, _) = answer(&engine, greedy(vec![asking(shapes(), QUESTION)], 12));
    assert_ne!(shapes_ids, ids);
}

#[test]
fn qwen3_vl_answers_in_the_flow_with_its_deepstack_rows_and_a_follow_up_reuses_them() {
    let (model, projector) = ("qwen3vl-test.Q8_0", "qwen3vl-mmproj-test.F16");
    // The picture's 54 rows (9 × 6), each with two deepstack rows, whole in one step.
    let first = vec![asking(shapes(), QUESTION)];
    let (engine, ids) = same_in_chunks(model, projector, &first);
    follow_up_as_fresh(&engine, paired(model, projector, 256), &first, &ids, 54);
    // A projector whose deepstack rows the model does not read belongs to another model.
    let mut config = EngineConfig::new(common::test_model("qwen2vl-test.Q8_0"));
    config.projector = Some(common::test_model(projector));
    let err = Engine::start(config).err().unwrap().to_string();
    assert!(err.contains("deepstack"), "{err}");
}
