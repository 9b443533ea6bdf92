//! Speculative decoding's counts in the store (issue 17), on a real SQLite file: an answer
//! keeps how many draft tokens were proposed and accepted, reads them back, and carries them
//! through the JSON export; an answer that did not speculate has none, and an export from
//! before them still imports.

use rill_store::{MessageStats, NewConversation, NewMessage, Status, Store};

async fn answered(store: &Store, stats: MessageStats) -> i64 {
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let q = store
        .append(c.id, NewMessage::user("Repeat: the river carried grain."))
        .await
        .unwrap();
    let w = store
        .begin_answer(c.id, Some(q.id), None, None)
        .await
        .unwrap();
    w.push("The river carried grain.");
    w.finish(Status::Done, stats, None).await.unwrap();
    c.id
}

#[tokio::test]
async fn an_answer_keeps_its_draft_counts_through_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("rill.db")).await.unwrap();
    let stats = MessageStats {
        completion_tokens: Some(6),
        draft_proposed: Some(9),
        draft_accepted: Some(5),
        ..Default::default()
    };
    let c = answered(&store, stats).await;
    let path = store.current_path(c).await.unwrap();
    assert_eq!(
        (path[1].stats.draft_proposed, path[1].stats.draft_accepted),
        (Some(9), Some(5))
    );
    assert_eq!(path[0].stats.draft_proposed, None);

    let json = store.export_json(c).await.unwrap();
    let file: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(file["version"], rill_store::EXPORT_VERSION);
    assert_eq!(file["messages"][1]["draft_proposed"], 9);
    assert_eq!(file["messages"][1]["draft_accepted"], 5);
    assert!(
        file["messages"][0].get("draft_proposed").is_none(),
        "{json}"
    );
    let copy = store.import_json(&json).await.unwrap();
    assert_eq!(store.export_json(copy).await.unwrap(), json);

    // A version 4 file (no counts) imports, with none.
    let mut old = file.clone();
    old["version"] = 4.into();
    for m in old["messages"].as_array_mut().unwrap() {
        let m = m.as_object_mut().unwrap();
        m.remove("draft_proposed");
        m.remove("draft_accepted");
    }
    let copy = store.import_json(&old.to_string()).await.unwrap();
    let path = store.current_path(copy).await.unwrap();
    assert_eq!(path[1].content, "The river carried grain.");
    assert_eq!(path[1].stats.draft_proposed, None);
}

#[tokio::test]
async fn an_answer_that_did_not_speculate_has_no_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("rill.db")).await.unwrap();
    let c = answered(&store, MessageStats::default()).await;
    let path = store.current_path(c).await.unwrap();
    assert_eq!(
        (path[1].stats.draft_proposed, path[1].stats.draft_accepted),
        (None, None)
    );
    let json = store.export_json(c).await.unwrap();
    assert!(!json.contains("draft_"), "{json}");
}
