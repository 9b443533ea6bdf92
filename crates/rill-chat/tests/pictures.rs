//! An answer about a picture, continued (issue 42): the conversation's pictures go with the
//! continued prompt, on a real SQLite file and the Gemma 4 test model with its test projector
//! (`scripts/make-test-models.py`, `scripts/make-test-projectors.py`).

use std::path::PathBuf;

use rill_chat::AnswerOptions;
use rill_engine::{Engine, EngineConfig, SamplingParams};
use rill_store::{NewConversation, NewMessage, Status, Store};

fn test_model(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/test-models")
        .join(format!("{name}.gguf"));
    assert!(p.is_file(), "test model missing at {}", p.display());
    p
}

fn picture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rill-engine/tests/fixtures/images")
        .join(name);
    std::fs::read(p).unwrap()
}

/// A stopped answer "The picture shows" to a question about `image`, continued greedily: the
/// continued message and what the continuation added.
async fn continued(
    store: &Store,
    engine: &Engine,
    image: Vec<u8>,
) -> (rill_store::Message, String) {
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap()
        .id;
    let question = NewMessage {
        images: vec![image],
        ..NewMessage::user("What is in this picture?")
    };
    store.append(c, question).await.unwrap();
    let partial = NewMessage {
        status: Status::Stopped,
        ..NewMessage::assistant("The picture shows")
    };
    let partial = store.append(c, partial).await.unwrap();
    let options = AnswerOptions {
        params: SamplingParams::greedy(),
        max_tokens: Some(8),
        ..Default::default()
    };
    let answer = rill_chat::continue_answer(&engine.handle(), store, partial.id, options, |_| {})
        .await
        .unwrap();
    let added = answer.message.content["The picture shows".len()..].to_string();
    (answer.message, added)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_about_a_picture_is_continued_with_the_picture() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("rill.db")).await.unwrap();
    let mut config = EngineConfig::new(test_model("gemma4v-test.Q8_0"));
    config.projector = Some(test_model("gemma4-mmproj-test.F16"));
    config.threads = Some(2);
    let engine = Engine::start(config).unwrap();
    let (message, shapes) = continued(&store, &engine, picture("shapes.png")).await;
    assert!(message.content.starts_with("The picture shows"));
    assert!(!shapes.is_empty(), "nothing added");
    assert_eq!(message.status, Status::Done);
    // The same words continued about another picture go on otherwise: the picture is in the
    // continued prompt, not only the text.
    let mut other = image::RgbImage::new(64, 48);
    other.pixels_mut().for_each(|p| p.0 = [200, 30, 30]);
    let mut png = Vec::new();
    other
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let (_, red) = continued(&store, &engine, png).await;
    assert_ne!(red, shapes);
    // The same picture again: the same continuation (its rows kept, its cache reused).
    let (_, again) = continued(&store, &engine, picture("shapes.png")).await;
    assert_eq!(again, shapes);
}
