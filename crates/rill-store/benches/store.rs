//! Store timings for BENCHMARKS.md: opening a 10,000-message conversation and full-text search
//! over 100,000 messages, on a real SQLite file. Run with `cargo bench -p rill-store`.
//! (Under `cargo test` this target only checks that it builds and starts.)

use std::time::Instant;

use rill_store::{NewConversation, NewMessage, Store};
use serde_json::json;

const WORDS: &[&str] = &[
    "river", "bread", "dragon", "compiler", "garden", "physics", "music", "window", "mountain",
    "coffee", "rust", "memory", "story", "planet", "engine", "language", "ocean", "market",
    "winter", "library",
];

/// A JSON export of one conversation: a chain of `n` messages with varied text.
fn export_of(n: usize, seed: usize) -> String {
    let messages: Vec<_> = (0..n)
        .map(|i| {
            let text: Vec<&str> = (0..24).map(|k| WORDS[(i * 7 + k * 13 + seed * 3 + k * k) % WORDS.len()]).collect();
            json!({
                "id": i, "parent": if i == 0 { None } else { Some(i - 1) },
                "role": if i % 2 == 0 { "user" } else { "assistant" },
                "content": format!("Message {i} of {seed}: {}.", text.join(" ")),
                "status": "done", "model": null, "settings": null, "prompt_tokens": null, "completion_tokens": null,
                "ttft_ms": null, "decode_tps": null, "error": null, "created_at": 0, "updated_at": 0
            })
        })
        .collect();
    json!({
        "format": "rill-conversation", "version": 1,
        "conversation": {"title": format!("bench {seed}"), "title_by_user": false, "created_at": 0, "updated_at": 0,
            "model": null, "system_prompt": null, "settings": {}, "pinned": false, "archived": false, "current_leaf": n - 1},
        "messages": messages
    })
    .to_string()
}

fn median_ms(mut f: impl FnMut(), runs: usize) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("store benchmarks: run with `cargo bench -p rill-store`");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("bench.db")).await.unwrap();

        let big = store.import_json(&export_of(10_000, 0)).await.unwrap();
        let h = tokio::runtime::Handle::current();
        let open_ms = median_ms(
            || {
                tokio::task::block_in_place(|| h.block_on(store.current_path(big)).unwrap());
            },
            21,
        );
        let all_ms = median_ms(
            || {
                tokio::task::block_in_place(|| h.block_on(store.all_messages(big)).unwrap());
            },
            21,
        );
        println!("open a 10,000-message conversation (current_path): {open_ms:.1} ms median of 21");
        println!("load all 10,000 messages of it (all_messages):     {all_ms:.1} ms median of 21");

        for seed in 1..10 {
            store.import_json(&export_of(10_000, seed)).await.unwrap();
        }
        let c = store
            .create_conversation(NewConversation::default())
            .await
            .unwrap();
        store
            .append(c.id, NewMessage::user("the quick brown fox"))
            .await
            .unwrap();
        for q in ["dragon", "river bread", "compil", "quick brown fox"] {
            let ms = median_ms(
                || {
                    tokio::task::block_in_place(|| h.block_on(store.search(q, 20)).unwrap());
                },
                21,
            );
            println!("search {q:?} over 100,001 messages (top 20): {ms:.1} ms median of 21");
        }
    });
}
