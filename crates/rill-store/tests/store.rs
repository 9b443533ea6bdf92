//! The store on real SQLite files in temporary folders.

use rill_store::{Error, MessageStats, NewConversation, NewMessage, Role, Status, Store};
use serde_json::json;

mod common;
use common::{conversation_with_turns, db};

#[tokio::test]
async fn migrations_apply_to_an_empty_file_and_opening_again_changes_nothing() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(&store, &[("Hello", "Hi!")]).await;
    drop(store);
    let store = Store::open(&path).await.unwrap();
    assert_eq!(store.current_path(id).await.unwrap().len(), 2);
    let store2 = Store::open(&path).await.unwrap();
    assert_eq!(store2.list_conversations(false).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_refused_and_left_untouched() {
    let (_dir, path) = db();
    let original = b"my notes, definitely not a database\n".repeat(100);
    std::fs::write(&path, &original).unwrap();
    match Store::open(&path).await {
        Err(Error::NotADatabase { .. }) => {}
        other => panic!("expected NotADatabase, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        original,
        "the file was not modified"
    );
    assert!(!path.with_extension("db-wal").exists());

    // A SQLite header over garbage: refused too, and not overwritten.
    let mut corrupt = b"SQLite format 3\0".to_vec();
    corrupt.extend(std::iter::repeat_n(0xAB, 8192));
    std::fs::write(&path, &corrupt).unwrap();
    match Store::open(&path).await {
        Err(Error::NotADatabase { .. }) => {}
        other => panic!("expected NotADatabase for a corrupt file, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        corrupt,
        "the corrupt file was not modified"
    );
}

#[tokio::test]
async fn titles_follow_the_first_user_message_until_renamed() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    store
        .append(
            c.id,
            NewMessage::user("\n  What is the capital of France?  \nAnswer briefly."),
        )
        .await
        .unwrap();
    store
        .append(c.id, NewMessage::user("Another question"))
        .await
        .unwrap();
    assert_eq!(
        store.conversation(c.id).await.unwrap().title,
        "What is the capital of France?"
    );
    store.rename(c.id, "Geography").await.unwrap();
    let c = store.conversation(c.id).await.unwrap();
    assert_eq!((c.title.as_str(), c.title_by_user), ("Geography", true));
    let long = "x".repeat(100);
    let d = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    store.append(d.id, NewMessage::user(long)).await.unwrap();
    assert_eq!(
        store
            .conversation(d.id)
            .await
            .unwrap()
            .title
            .chars()
            .count(),
        61
    );
}

#[tokio::test]
async fn editing_and_regenerating_make_branches_and_switching_changes_what_comes_next() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let q1 = store
        .append(c.id, NewMessage::user("Name a fruit."))
        .await
        .unwrap();
    let a1 = store
        .append(c.id, NewMessage::assistant("Apple."))
        .await
        .unwrap();
    let q2 = store
        .append(c.id, NewMessage::user("And a colour?"))
        .await
        .unwrap();
    store
        .append(c.id, NewMessage::assistant("Red."))
        .await
        .unwrap();

    // Edit the second question: a new branch from the first answer.
    let q2b = store.edit(q2.id, "And a vegetable?").await.unwrap();
    assert_eq!(q2b.parent_id, Some(a1.id));
    let a2b = store
        .append(c.id, NewMessage::assistant("Carrot."))
        .await
        .unwrap();
    // Regenerate that answer: a sibling of it.
    let a2c = store
        .add_child(c.id, Some(q2b.id), NewMessage::assistant("Potato."))
        .await
        .unwrap();

    let texts =
        |path: Vec<rill_store::Message>| path.into_iter().map(|m| m.content).collect::<Vec<_>>();
    assert_eq!(
        texts(store.current_path(c.id).await.unwrap()),
        ["Name a fruit.", "Apple.", "And a vegetable?", "Potato."]
    );
    assert_eq!(
        store.siblings(q2.id).await.unwrap(),
        vec![q2.id, q2b.id],
        "the question has two versions"
    );
    assert_eq!(
        store.siblings(a2b.id).await.unwrap(),
        vec![a2b.id, a2c.id],
        "the answer has two versions"
    );

    // Back to the original branch: the next generation sees the original history.
    let path = store.switch_branch(q2.id).await.unwrap();
    assert_eq!(
        texts(path),
        ["Name a fruit.", "Apple.", "And a colour?", "Red."]
    );
    assert_eq!(
        texts(store.current_path(c.id).await.unwrap()),
        ["Name a fruit.", "Apple.", "And a colour?", "Red."]
    );
    let next = store
        .append(c.id, NewMessage::user("Thanks"))
        .await
        .unwrap();
    assert_eq!(
        store.path_to(next.id).await.unwrap()[2].content,
        "And a colour?"
    );
    // Every message of every branch is still there.
    assert_eq!(store.all_messages(c.id).await.unwrap().len(), 8);
    assert_eq!(q1.parent_id, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_file_never_see_database_is_locked() {
    let (_dir, path) = db();
    let app = Store::open(&path).await.unwrap();
    let api = Store::open(&path).await.unwrap();
    let c1 = app
        .create_conversation(NewConversation::default())
        .await
        .unwrap()
        .id;
    let c2 = api
        .create_conversation(NewConversation::default())
        .await
        .unwrap()
        .id;
    let mut tasks = Vec::new();
    for (store, conv) in [
        (app.clone(), c1),
        (api.clone(), c2),
        (app.clone(), c2),
        (api.clone(), c1),
    ] {
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                store
                    .append(conv, NewMessage::user(format!("message {i}")))
                    .await?;
                if i % 10 == 0 {
                    let w = store.begin_answer(conv, None, None, None).await?;
                    w.push("partial");
                    w.finish(Status::Stopped, MessageStats::default(), None)
                        .await?;
                }
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(
        app.all_messages(c1).await.unwrap().len() + app.all_messages(c2).await.unwrap().len(),
        440
    );
}

#[tokio::test]
async fn search_finds_ranked_snippets_and_follows_edits_and_deletes() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let a = conversation_with_turns(
        &store,
        &[(
            "How do I bake bread?",
            "Mix flour, water, salt and yeast; knead; let it rise; bake.",
        )],
    )
    .await;
    let b = conversation_with_turns(
        &store,
        &[(
            "Tell me about sourdough bread and bread starters",
            "A starter is flour and water.",
        )],
    )
    .await;
    let hits = store.search("bread", 10).await.unwrap();
    assert_eq!(hits.len(), 2);
    assert_eq!(hits[0].conversation_id, b, "two mentions rank above one");
    assert!(hits[0].snippet.contains("[bread]"), "{}", hits[0].snippet);
    assert_eq!(hits[1].role, Role::User);
    // Prefix search for search-as-you-type, and syntax in the query is just text.
    assert_eq!(store.search("sourd", 10).await.unwrap().len(), 1);
    assert!(store
        .search("\"unbalanced AND (", 10)
        .await
        .unwrap()
        .is_empty());
    // The index follows updates and deletes.
    let msg = store.current_path(a).await.unwrap()[1].id;
    store
        .update_message(
            msg,
            "Use a bread machine.",
            Status::Done,
            &MessageStats::default(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(store.search("machine", 10).await.unwrap().len(), 1);
    assert!(store.search("knead", 10).await.unwrap().is_empty());
    store.delete_conversation(b).await.unwrap();
    assert!(store.search("sourdough", 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn json_export_import_export_is_identical_and_bad_files_change_nothing() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(
        &store,
        &[
            ("Hi 👋", "Hello! ¿Qué tal?"),
            ("Write code", "```rust\nfn main() {}\n```"),
        ],
    )
    .await;
    let q = store.current_path(id).await.unwrap()[2].id;
    store.edit(q, "Write a poem").await.unwrap();
    store
        .set_settings(id, &json!({"temperature": 0.7, "top_p": 0.9}))
        .await
        .unwrap();
    store.set_system_prompt(id, Some("Be kind.")).await.unwrap();
    store.set_pinned(id, true).await.unwrap();
    let exported = store.export_json(id).await.unwrap();

    let (_dir2, path2) = db();
    let fresh = Store::open(&path2).await.unwrap();
    fresh
        .create_conversation(NewConversation::default())
        .await
        .unwrap(); // so ids differ
    let imported = fresh.import_json(&exported).await.unwrap();
    assert_ne!(imported, id);
    assert_eq!(fresh.export_json(imported).await.unwrap(), exported);
    assert_eq!(
        fresh
            .current_path(imported)
            .await
            .unwrap()
            .last()
            .unwrap()
            .content,
        "Write a poem"
    );

    let count = || async { fresh.list_conversations(true).await.unwrap().len() };
    let before = count().await;
    let mut newer: serde_json::Value = serde_json::from_str(&exported).unwrap();
    newer["version"] = json!(99);
    let err = fresh.import_json(&newer.to_string()).await.unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
    let mut broken: serde_json::Value = serde_json::from_str(&exported).unwrap();
    broken["messages"][1]["parent"] = json!(7);
    assert!(matches!(
        fresh.import_json(&broken.to_string()).await,
        Err(Error::Import(_))
    ));
    broken["messages"][1]["role"] = json!("wizard");
    assert!(matches!(
        fresh.import_json(&broken.to_string()).await,
        Err(Error::Import(_))
    ));
    assert!(matches!(
        fresh.import_json("{\"hello\": 1}").await,
        Err(Error::Import(_))
    ));
    assert!(matches!(
        fresh.import_json("not json").await,
        Err(Error::Import(_))
    ));
    assert_eq!(count().await, before, "failed imports change nothing");
}

#[tokio::test]
async fn markdown_export_shows_the_current_branch() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(&store, &[("What is 2+2?", "4.")]).await;
    let a = store.current_path(id).await.unwrap()[1].id;
    store.edit(a, "Four.").await.unwrap();
    let md = store.export_markdown(id).await.unwrap();
    assert!(md.starts_with("# What is 2+2?\n"), "{md}");
    assert!(md.contains("## User\n\nWhat is 2+2?"));
    assert!(md.contains("## Assistant\n\nFour."));
    assert!(!md.contains("4."), "only the current branch");
}

#[tokio::test]
async fn presets_and_settings_persist() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    store
        .save_preset("precise", &json!({"temperature": 0.1}))
        .await
        .unwrap();
    store
        .save_preset("precise", &json!({"temperature": 0.2}))
        .await
        .unwrap();
    store
        .save_preset("creative", &json!({"temperature": 1.2}))
        .await
        .unwrap();
    store.set_setting("theme", &json!("dark")).await.unwrap();
    let store = Store::open(&path).await.unwrap();
    let presets = store.presets().await.unwrap();
    assert_eq!(
        presets.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["creative", "precise"]
    );
    assert_eq!(presets[1].settings, json!({"temperature": 0.2}));
    assert_eq!(store.setting("theme").await.unwrap(), Some(json!("dark")));
    assert_eq!(store.setting("missing").await.unwrap(), None);
}

#[tokio::test]
async fn a_database_from_a_newer_rill_is_refused_clearly() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time) VALUES (99, 'from the future', CURRENT_TIMESTAMP, 1, x'00', 0)")
        .execute(&sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap())
        .await
        .unwrap();
    drop(store);
    match Store::open(&path).await {
        Err(Error::NewerSchema { .. }) => {}
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

#[tokio::test]
async fn an_answers_token_probabilities_are_kept_and_go_with_it() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(&store, &[("Sky?", "Blue.")]).await;
    let answer = store.current_path(id).await.unwrap()[1].id;
    assert_eq!(store.message_tokens(answer).await.unwrap(), None);
    let tokens = json!([
        {"id": 5, "text": "Blue", "candidates": [{"id": 5, "text": "Blue", "raw": 0.6, "sampled": 1.0}]},
        {"id": 6, "text": ".", "candidates": [{"id": 6, "text": ".", "raw": 0.9, "sampled": 1.0}]}
    ]);
    store.set_message_tokens(answer, &tokens).await.unwrap();
    // Kept across a reopen of the file.
    drop(store);
    let store = Store::open(&path).await.unwrap();
    assert_eq!(store.message_tokens(answer).await.unwrap(), Some(tokens));
    // Replaced, not duplicated; gone with the conversation.
    store.set_message_tokens(answer, &json!([])).await.unwrap();
    assert_eq!(store.message_tokens(answer).await.unwrap(), Some(json!([])));
    store.delete_conversation(id).await.unwrap();
    assert_eq!(store.message_tokens(answer).await.unwrap(), None);
}

/// Issue 13: the JSON export is lossless for token probabilities too; and it never carries a
/// key, whatever the settings hold.
#[tokio::test]
async fn json_export_keeps_token_probabilities_and_leaves_keys_out() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(&store, &[("Sky?", "Blue.")]).await;
    store
        .set_settings(
            id,
            &json!({"temperature": 0.5, "remote": {"url": "http://gpu:8000", "model": "m", "api_key": "sk-secret"}}),
        )
        .await
        .unwrap();
    let answer = store.current_path(id).await.unwrap()[1].id;
    let tokens = json!([{"id": 5, "text": "Blue", "candidates": [{"id": 5, "text": "Blue", "raw": 0.6, "sampled": 1.0}]}]);
    store.set_message_tokens(answer, &tokens).await.unwrap();
    let exported = store.export_json(id).await.unwrap();
    assert!(!exported.contains("sk-secret"), "{exported}");
    assert!(!exported.contains("api_key"), "{exported}");

    let (_dir2, path2) = db();
    let fresh = Store::open(&path2).await.unwrap();
    let imported = fresh.import_json(&exported).await.unwrap();
    let answer2 = fresh.current_path(imported).await.unwrap()[1].id;
    assert_eq!(fresh.message_tokens(answer2).await.unwrap(), Some(tokens));
    // The import keeps everything but the remote server (issue 40): exported again, it is the
    // same file without it.
    let mut expected: serde_json::Value = serde_json::from_str(&exported).unwrap();
    expected["conversation"]["settings"]
        .as_object_mut()
        .unwrap()
        .remove("remote");
    let again: serde_json::Value =
        serde_json::from_str(&fresh.export_json(imported).await.unwrap()).unwrap();
    assert_eq!(again, expected);
    assert!(fresh.conversation(imported).await.unwrap().settings["remote"].is_null());
}

/// Issue 40: an export someone sends cannot point the app at their server. The messages and
/// the sampling settings come in; the `remote` backend does not.
#[tokio::test]
async fn an_imported_conversation_keeps_its_messages_but_not_its_remote_server() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let id = conversation_with_turns(&store, &[("Hi", "Hello!")]).await;
    store
        .set_settings(
            id,
            &json!({"temperature": 0.3, "remote": {"url": "http://203.0.113.9:8000/v1", "model": "spy"}}),
        )
        .await
        .unwrap();
    let exported = store.export_json(id).await.unwrap();
    assert!(
        exported.contains("203.0.113.9"),
        "the export keeps what it had"
    );
    let imported = store.import_json(&exported).await.unwrap();
    let settings = store.conversation(imported).await.unwrap().settings;
    assert_eq!(settings, json!({"temperature": 0.3}));
    let texts: Vec<String> = store
        .current_path(imported)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.content)
        .collect();
    assert_eq!(texts, ["Hi", "Hello!"]);
}
