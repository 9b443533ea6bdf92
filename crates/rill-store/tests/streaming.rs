//! The store's streaming writer on real SQLite files: an answer on disk within 250 ms and
//! finished with its stats, answers left streaming by a crash marked interrupted and continued,
//! a conversation saved whole never seen half written, the file opened again beside live
//! answers, a second writer on one answer refused, failed writes (a trigger failing them as a
//! full disk would) tried again, and an answer indexed for search once it ends.

use std::time::Duration;

use rill_store::{Error, MessageStats, NewConversation, NewMessage, Status, Store};
use serde_json::json;

mod common;
use common::{db, empty_conversation};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_answer_is_on_disk_within_250_ms_and_finished_with_its_stats() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let reader = Store::open(&path).await.unwrap(); // another connection pool, like another process
    let c = store
        .create_conversation(NewConversation::default())
        .await
        .unwrap();
    let q = store
        .append(c.id, NewMessage::user("Count."))
        .await
        .unwrap();
    let w = store
        .begin_answer(
            c.id,
            Some(q.id),
            Some("m".into()),
            Some(json!({"temperature": 0.0})),
        )
        .await
        .unwrap();
    let id = w.message_id();
    let pushed = std::time::Instant::now();
    w.push("one ");
    w.push("two ");
    // On disk within 250 ms of the first piece (plus 40 ms for the write itself), seen from
    // the other connection.
    let m = loop {
        let m = reader.message(id).await.unwrap();
        if m.content == "one two " || pushed.elapsed() > Duration::from_millis(290) {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        (m.content.as_str(), m.status),
        ("one two ", Status::Streaming),
        "after {:?}",
        pushed.elapsed()
    );
    w.push("three");
    let stats = MessageStats {
        prompt_tokens: Some(12),
        completion_tokens: Some(3),
        ttft_ms: Some(40.0),
        decode_tps: Some(30.0),
        ..Default::default()
    };
    let done = w.finish(Status::Done, stats.clone(), None).await.unwrap();
    assert_eq!(
        (done.content.as_str(), done.status),
        ("one two three", Status::Done)
    );
    assert_eq!(done.stats, stats);
    assert_eq!(done.settings, Some(json!({"temperature": 0.0})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_left_streaming_become_interrupted_and_can_be_continued() {
    let (_dir, path) = db();
    // The writer runs on a runtime of its own, dropped mid-answer: its task dies as with the
    // process (no finish, no drop of the writer). `rill chat` killed with SIGKILL is the same
    // case across processes (crates/rill-cli/tests/cli.rs).
    let p = path.clone();
    let id = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let id = rt.block_on(async {
            let store = Store::open(&p).await.unwrap();
            let c = store
                .create_conversation(NewConversation::default())
                .await
                .unwrap();
            store
                .append(c.id, NewMessage::user("Tell me a story."))
                .await
                .unwrap();
            let w = store.begin_answer(c.id, None, None, None).await.unwrap();
            w.push("Once upon");
            tokio::time::sleep(Duration::from_millis(400)).await;
            let id = w.message_id();
            std::mem::forget(w);
            id
        });
        drop(rt);
        id
    })
    .join()
    .unwrap();
    let store = Store::open(&path).await.unwrap();
    let m = store.message(id).await.unwrap();
    assert_eq!(
        (m.content.as_str(), m.status),
        ("Once upon", Status::Interrupted)
    );
    let w = store.resume_answer(id).await.unwrap();
    w.push(" a time.");
    let m = w
        .finish(Status::Done, MessageStats::default(), None)
        .await
        .unwrap();
    assert_eq!(
        (m.content.as_str(), m.status),
        ("Once upon a time.", Status::Done)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_saved_whole_is_never_seen_half_written() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let reader = Store::open(&path).await.unwrap();
    let writes = tokio::spawn(async move {
        for i in 0..30 {
            let messages = [
                NewMessage::user(format!("question {i}")),
                NewMessage::assistant("one"),
                NewMessage::user("and then?"),
                NewMessage::assistant(format!("answer {i}")),
            ];
            let stats = MessageStats {
                prompt_tokens: Some(40),
                completion_tokens: Some(i),
                ttft_ms: Some(12.5),
                decode_tps: Some(30.0),
                ..Default::default()
            };
            store
                .save_conversation(NewConversation::default(), &messages, &stats)
                .await
                .unwrap();
        }
    });
    let mut checked = 0;
    while !writes.is_finished() || checked == 0 {
        for c in reader.list_conversations(false).await.unwrap() {
            let path = reader.current_path(c.id).await.unwrap();
            assert_eq!(path.len(), 4, "conversation {} seen half written", c.id);
            checked += 1;
        }
    }
    writes.await.unwrap();
    let all = reader.list_conversations(false).await.unwrap();
    assert_eq!(all.len(), 30);
    let first = all.iter().find(|c| c.title == "question 0").unwrap();
    let path = reader.current_path(first.id).await.unwrap();
    let texts: Vec<&str> = path.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["question 0", "one", "and then?", "answer 0"]);
    assert_eq!(path[3].stats.completion_tokens, Some(0));
    assert_eq!(path[3].stats.decode_tps, Some(30.0));
    assert_eq!(
        path[1].stats,
        MessageStats::default(),
        "only the last answer has stats"
    );
}

/// Issue 13: opening the database elsewhere (`rill conversations`, `rill chat`, `rill serve
/// --save` beside the app) leaves the answers being written alone, a paused one too (its
/// writer says it is alive while no text comes); only an answer whose writer is gone becomes
/// `interrupted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_the_file_again_leaves_live_answers_streaming() {
    let (_dir, path) = db();
    let app = Store::open(&path).await.unwrap();
    let c = empty_conversation(&app).await;
    let streaming = app.begin_answer(c, None, None, None).await.unwrap();
    streaming.push("Still going");
    let paused = app.begin_answer(c, None, None, None).await.unwrap();
    paused.push("Paused here");
    tokio::time::sleep(Duration::from_millis(1500)).await; // no text for the paused one since
    let cli = Store::open(&path).await.unwrap();
    for w in [&streaming, &paused] {
        assert_eq!(
            cli.message(w.message_id()).await.unwrap().status,
            Status::Streaming
        );
    }
    streaming.push(", and done.");
    let m = streaming
        .finish(Status::Done, MessageStats::default(), None)
        .await
        .unwrap();
    assert_eq!(
        (m.content.as_str(), m.status),
        ("Still going, and done.", Status::Done)
    );
    // The paused answer's writer goes away without finishing: it is kept, interrupted.
    let paused_id = paused.message_id();
    drop(paused);
    let m = loop {
        let m = cli.message(paused_id).await.unwrap();
        if m.status != Status::Streaming {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        (m.content.as_str(), m.status),
        ("Paused here", Status::Interrupted)
    );
}

/// Issue 13: one answer, one writer. Continuing an answer that is being written (a double
/// click on Continue, or the CLI and the app at once) is refused; so is continuing one that is
/// done. The first writer keeps its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_on_one_answer_is_refused() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let other = Store::open(&path).await.unwrap();
    let c = empty_conversation(&store).await;
    let w = store.begin_answer(c, None, None, None).await.unwrap();
    w.push("Once");
    let id = w.message_id();
    let stopped = w
        .finish(Status::Stopped, MessageStats::default(), None)
        .await
        .unwrap();
    assert_eq!(stopped.status, Status::Stopped);
    let first = store.resume_answer(id).await.unwrap();
    for s in [&store, &other] {
        match s.resume_answer(id).await {
            Err(
                e @ Error::NotContinuable {
                    status: Status::Streaming,
                    ..
                },
            ) => assert!(e.to_string().contains("being written"), "{e}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a second writer was started"),
        }
    }
    first.push(" upon a time.");
    let done = first
        .finish(Status::Done, MessageStats::default(), None)
        .await
        .unwrap();
    assert_eq!(done.content, "Once upon a time.");
    assert!(matches!(
        store.resume_answer(id).await,
        Err(Error::NotContinuable {
            status: Status::Done,
            ..
        })
    ));
}

/// Makes every change to a message's text fail, as a full disk would, until released: a
/// trigger on the real file, from a connection of its own.
async fn failing_writes(path: &std::path::Path) -> sqlx::SqliteConnection {
    use sqlx::Connection;
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    for sql in [
        "CREATE TABLE fail_writes (on_ INTEGER)",
        "CREATE TRIGGER fail_writes BEFORE UPDATE OF content ON messages
         WHEN (SELECT count(*) FROM fail_writes) > 0 BEGIN SELECT RAISE(ABORT, 'disk full (test)'); END",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await.unwrap();
    }
    c
}

async fn set_failing(c: &mut sqlx::SqliteConnection, on: bool) {
    let sql = if on {
        "INSERT INTO fail_writes VALUES (1)"
    } else {
        "DELETE FROM fail_writes"
    };
    sqlx::query(sql).execute(c).await.unwrap();
}

/// Issue 13: a write that fails is tried again without waiting for more text, and so is the
/// final one: the answer is not left `streaming` with its end lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_writes_of_a_streaming_answer_are_tried_again() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let mut control = failing_writes(&path).await;
    let c = empty_conversation(&store).await;
    let w = store.begin_answer(c, None, None, None).await.unwrap();
    let id = w.message_id();
    set_failing(&mut control, true).await;
    w.push("kept despite a failed write");
    tokio::time::sleep(Duration::from_millis(400)).await; // the timed write fails
    assert_eq!(store.message(id).await.unwrap().content, "");
    set_failing(&mut control, false).await;
    // No more text comes; the retry writes what the failed write could not.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.message(id).await.unwrap().content,
        "kept despite a failed write"
    );

    set_failing(&mut control, true).await;
    w.push(", and the end.");
    let finish = tokio::spawn(w.finish(Status::Done, MessageStats::default(), None));
    tokio::time::sleep(Duration::from_millis(600)).await;
    set_failing(&mut control, false).await;
    let m = finish.await.unwrap().unwrap();
    assert_eq!(
        (m.content.as_str(), m.status),
        ("kept despite a failed write, and the end.", Status::Done)
    );
}

/// Issue 13: search indexes an answer when it ends, not at every flush (which re-indexed the
/// whole growing text each time); the finished text is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_answer_is_indexed_once_it_ends() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = empty_conversation(&store).await;
    let w = store.begin_answer(c, None, None, None).await.unwrap();
    w.push("zebras gallop");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(store.search("zebras", 10).await.unwrap().is_empty());
    w.push(" across savannahs");
    w.finish(Status::Done, MessageStats::default(), None)
        .await
        .unwrap();
    let hits = store.search("savannahs", 10).await.unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(store.search("zebras", 10).await.unwrap().len(), 1);
}
