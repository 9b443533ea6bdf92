//! What the store's tests share: a database path in a fresh folder, and conversations to
//! start from.

#![allow(dead_code)]

use rill_store::{NewConversation, NewMessage, Store};

/// A fresh folder and the path of a database file in it (not created yet).
pub fn db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rill.db");
    (dir, path)
}

/// A new conversation with no messages.
pub async fn empty_conversation(store: &Store) -> i64 {
    store
        .create_conversation(NewConversation::default())
        .await
        .unwrap()
        .id
}

/// A conversation of these (question, answer) turns.
pub async fn conversation_with_turns(store: &Store, turns: &[(&str, &str)]) -> i64 {
    let c = store
        .create_conversation(NewConversation {
            model: Some("smollm2".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    for (q, a) in turns {
        store.append(c.id, NewMessage::user(*q)).await.unwrap();
        store.append(c.id, NewMessage::assistant(*a)).await.unwrap();
    }
    c.id
}
