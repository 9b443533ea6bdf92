//! A thinking model's reasoning in the store (issue 16), on real SQLite files: written while it
//! streams beside the answer's text, finished with its token count and time, continued, found
//! by search once the answer ends, and carried by both exports.

use std::time::Duration;

use rill_store::{MessageStats, NewConversation, NewMessage, Status, Store};

mod common;
use common::db;

fn thought(tokens: i64, ms: f64) -> MessageStats {
    MessageStats {
        completion_tokens: Some(tokens + 2),
        reasoning_tokens: Some(tokens),
        reasoning_ms: Some(ms),
        ..Default::default()
    }
}

/// A conversation with a question and a finished answer that thought first.
async fn answered(store: &Store) -> (i64, i64) {
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let q = store
        .append(c.id, NewMessage::user("Is 91 prime?"))
        .await
        .unwrap();
    let w = store
        .begin_answer(c.id, Some(q.id), None, None)
        .await
        .unwrap();
    w.push_reasoning("91 is 7 times 13, a quasiprime");
    w.push("No: 91 = 7 × 13.");
    let m = w
        .finish(Status::Done, thought(9, 1250.0), None)
        .await
        .unwrap();
    (c.id, m.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_streams_to_disk_beside_the_text_and_ends_with_its_stats() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let reader = Store::open(&path).await.unwrap(); // another pool, as another process
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let w = store.begin_answer(c.id, None, None, None).await.unwrap();
    let id = w.message_id();
    let pushed = std::time::Instant::now();
    w.push_reasoning("Let me think. ");
    // A crash loses at most 250 ms of reasoning too (plus 40 ms for the write itself).
    let m = loop {
        let m = reader.message(id).await.unwrap();
        if !m.reasoning.is_empty() || pushed.elapsed() > Duration::from_millis(290) {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        (m.reasoning.as_str(), m.content.as_str(), m.status),
        ("Let me think. ", "", Status::Streaming),
        "after {:?}",
        pushed.elapsed()
    );
    w.push_reasoning("Done.");
    w.push("The answer.");
    let done = w
        .finish(Status::Done, thought(4, 300.0), None)
        .await
        .unwrap();
    assert_eq!(done.reasoning, "Let me think. Done.");
    assert_eq!(done.content, "The answer.");
    assert_eq!(done.stats.reasoning_tokens, Some(4));
    assert_eq!(done.stats.reasoning_ms, Some(300.0));
    // Read back the way lists and paths read messages (one JSON array built by SQLite).
    let path = reader.current_path(c.id).await.unwrap();
    assert_eq!(path[0].reasoning, "Let me think. Done.");
    assert_eq!(path[0].stats, done.stats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continued_answer_keeps_the_reasoning_it_had() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let w = store.begin_answer(c.id, None, None, None).await.unwrap();
    let id = w.message_id();
    w.push_reasoning("First half of a thought, ");
    w.finish(Status::Stopped, thought(5, 100.0), None)
        .await
        .unwrap();
    let w = store.resume_answer(id).await.unwrap();
    w.push_reasoning("second half.");
    w.push("Answer.");
    let m = w
        .finish(Status::Done, thought(9, 180.0), None)
        .await
        .unwrap();
    assert_eq!(m.reasoning, "First half of a thought, second half.");
    assert_eq!(m.content, "Answer.");
    assert_eq!(m.stats.reasoning_tokens, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_finds_words_of_the_reasoning_once_the_answer_ends() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let w = store.begin_answer(c.id, None, None, None).await.unwrap();
    let id = w.message_id();
    w.push_reasoning("pondering quasiprimes ");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(store.search("quasiprimes", 10).await.unwrap().is_empty());
    w.push("It is composite.");
    w.finish(Status::Done, MessageStats::default(), None)
        .await
        .unwrap();
    let hits = store.search("quasiprimes", 10).await.unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].message_id, id);
    assert!(hits[0].snippet.contains("[quasiprimes]"), "{hits:?}");
    // The content is found too, and a deleted conversation leaves the index.
    assert_eq!(store.search("composite", 10).await.unwrap().len(), 1);
    store.delete_conversation(c.id).await.unwrap();
    assert!(store.search("quasiprimes", 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn both_exports_carry_the_reasoning() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let (c, _) = answered(&store).await;

    let json = store.export_json(c).await.unwrap();
    let file: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(file["version"], rill_store::EXPORT_VERSION);
    let answer = &file["messages"][1];
    assert_eq!(answer["reasoning"], "91 is 7 times 13, a quasiprime");
    assert_eq!(answer["reasoning_tokens"], 9);
    // A question has none, and says nothing of it.
    assert!(file["messages"][0].get("reasoning").is_none(), "{json}");
    let copy = store.import_json(&json).await.unwrap();
    assert_eq!(store.export_json(copy).await.unwrap(), json);
    let imported = store.current_path(copy).await.unwrap();
    assert_eq!(imported[1].reasoning, "91 is 7 times 13, a quasiprime");
    assert_eq!(imported[1].stats.reasoning_ms, Some(1250.0));
    // The imported answer's reasoning is searchable as well.
    assert_eq!(store.search("quasiprime", 10).await.unwrap().len(), 2);

    let md = store.export_markdown(c).await.unwrap();
    let fold = md
        .find(
            "<details><summary>Thinking</summary>\n\n91 is 7 times 13, a quasiprime\n\n</details>",
        )
        .expect(&md);
    assert!(fold < md.find("No: 91 = 7 × 13.").unwrap(), "{md}");
    assert_eq!(md.matches("<details>").count(), 1, "{md}");
}

#[tokio::test]
async fn a_version_2_export_still_imports() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let (c, _) = answered(&store).await;
    let mut file: serde_json::Value =
        serde_json::from_str(&store.export_json(c).await.unwrap()).unwrap();
    file["version"] = 2.into();
    for m in file["messages"].as_array_mut().unwrap() {
        let m = m.as_object_mut().unwrap();
        m.remove("reasoning");
        m.remove("reasoning_tokens");
        m.remove("reasoning_ms");
    }
    let copy = store.import_json(&file.to_string()).await.unwrap();
    let path = store.current_path(copy).await.unwrap();
    assert_eq!(path[1].content, "No: 91 = 7 × 13.");
    assert_eq!(path[1].reasoning, "");
}
