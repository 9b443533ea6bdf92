//! Tool calls and results in the store (issue 16), on real SQLite files: an assistant's calls
//! and a tool's result kept as what they are, through both exports and an import; an answer's
//! calls set once they are read from its text; and a database from before them (schema 4)
//! migrated with every row, link and index kept.

use rill_store::{NewConversation, NewMessage, Role, Store};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

mod common;
use common::db;

fn weather_call() -> serde_json::Value {
    json!([{"id": "call0abcd", "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}])
}

/// A question, a call, its result and the final answer.
async fn called(store: &Store) -> i64 {
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    store
        .append(c.id, NewMessage::user("Weather in Paris?"))
        .await
        .unwrap();
    let call = NewMessage {
        tool_calls: Some(weather_call()),
        ..NewMessage::assistant("")
    };
    store.append(c.id, call).await.unwrap();
    store
        .append(
            c.id,
            NewMessage::tool("call0abcd", r#"{"forecast": ["sunny", "rain"]}"#),
        )
        .await
        .unwrap();
    store
        .append(c.id, NewMessage::assistant("Sunny, then rain."))
        .await
        .unwrap();
    c.id
}

#[tokio::test]
async fn calls_and_results_are_kept_as_such_through_both_exports_and_an_import() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = called(&store).await;
    let path_ = store.current_path(c).await.unwrap();
    let roles: Vec<Role> = path_.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
    );
    assert_eq!(path_[1].tool_calls, Some(weather_call()));
    assert_eq!(path_[2].tool_call_id.as_deref(), Some("call0abcd"));
    assert_eq!(path_[3].tool_calls, None);

    let exported = store.export_json(c).await.unwrap();
    let file: serde_json::Value = serde_json::from_str(&exported).unwrap();
    assert_eq!(file["version"], rill_store::EXPORT_VERSION);
    assert_eq!(file["messages"][1]["tool_calls"], weather_call());
    assert_eq!(file["messages"][2]["role"], "tool");
    assert_eq!(file["messages"][2]["tool_call_id"], "call0abcd");
    let copy = store.import_json(&exported).await.unwrap();
    assert_eq!(store.export_json(copy).await.unwrap(), exported);

    let md = store.export_markdown(c).await.unwrap();
    assert!(md.contains("**Call** `get_weather`"), "{md}");
    assert!(md.contains("\"city\": \"Paris\""), "{md}");
    assert!(md.contains("## Tool result"), "{md}");
    // An edit of a result stays a result for the same call.
    let edited = store
        .edit(path_[2].id, r#"{"forecast": []}"#)
        .await
        .unwrap();
    assert_eq!(edited.role, Role::Tool);
    assert_eq!(edited.tool_call_id.as_deref(), Some("call0abcd"));
}

#[tokio::test]
async fn an_answers_calls_replace_their_text_once_read() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let m = store
        .append(c.id, NewMessage::assistant("<tool_call>{…}</tool_call>"))
        .await
        .unwrap();
    store
        .set_tool_calls(m.id, "Let me look.", &weather_call())
        .await
        .unwrap();
    let m = store.message(m.id).await.unwrap();
    assert_eq!(m.content, "Let me look.");
    assert_eq!(m.tool_calls, Some(weather_call()));
    assert!(store
        .set_tool_calls(9999, "", &weather_call())
        .await
        .is_err());
}

#[tokio::test]
async fn a_database_from_before_tool_messages_keeps_every_row_link_and_index() {
    let (_dir, path) = db();
    // Schema 4, as the Rill before this one left it, with a tree, token data and a leaf.
    {
        let pool = SqlitePool::connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .foreign_keys(true),
        )
        .await
        .unwrap();
        let mut old = sqlx::migrate!("./migrations");
        old.migrations = old
            .migrations
            .iter()
            .filter(|m| m.version <= 4)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        old.run(&pool).await.unwrap();
        for sql in [
            "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'old', 1, 1)",
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, status, created_at, updated_at)
                 VALUES (1, 1, NULL, 'user', 'Is 91 prime?', 'done', 1, 1)",
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, reasoning, reasoning_tokens, status, created_at, updated_at)
                 VALUES (2, 1, 1, 'assistant', 'No: 7 × 13.', 'a quasiprime', 3, 'done', 2, 2)",
            "INSERT INTO message_tokens (message_id, tokens) VALUES (2, '[]')",
            "UPDATE conversations SET current_leaf_id = 2 WHERE id = 1",
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }

    let store = Store::open(&path).await.unwrap();
    let path_ = store.current_path(1).await.unwrap();
    assert_eq!(path_.len(), 2);
    assert_eq!(path_[1].parent_id, Some(1));
    assert_eq!(path_[1].reasoning, "a quasiprime");
    assert_eq!(path_[1].stats.reasoning_tokens, Some(3));
    assert_eq!(store.message_tokens(2).await.unwrap(), Some(json!([])));
    // The search index and its triggers work on the new table.
    assert_eq!(store.search("quasiprime", 10).await.unwrap().len(), 1);
    store
        .append(1, NewMessage::tool("call0abcd", "a result to find"))
        .await
        .unwrap();
    assert_eq!(store.search("find", 10).await.unwrap().len(), 1);
    // Foreign keys still hold: deleting the conversation takes its messages and their tokens.
    store.delete_conversation(1).await.unwrap();
    assert_eq!(store.message_tokens(2).await.ok().flatten(), None);
    assert!(store.message(1).await.is_err());
    // Opening again changes nothing.
    drop(store);
    Store::open(&path).await.unwrap();
}
