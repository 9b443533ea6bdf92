//! Writing an answer while it streams.
//!
//! A [`StreamWriter`] owns a small task that holds the answer's text. Text is pushed without
//! waiting (from any thread: the engine's token loop must not block on the disk); the task
//! writes it out at most 250 ms after the oldest unwritten piece arrived, and once more at the
//! end with the final status and stats. So a crash loses at most the last 250 ms of an answer,
//! and the store opens it as `interrupted`. If the writer is dropped without `finish`, what it
//! has is saved as `interrupted`.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::{Message, MessageStats, Result, Status, Store};

/// The longest an answer's text stays only in memory.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);

enum Cmd {
    Text(String),
    Finish {
        status: Status,
        stats: MessageStats,
        error: Option<String>,
        done: oneshot::Sender<Result<Message>>,
    },
}

/// Streams an answer's text into its message row.
pub struct StreamWriter {
    message_id: i64,
    tx: mpsc::UnboundedSender<Cmd>,
}

impl StreamWriter {
    pub(crate) fn start(store: Store, message_id: i64, initial: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, message_id, initial, rx));
        StreamWriter { message_id, tx }
    }

    pub fn message_id(&self) -> i64 {
        self.message_id
    }

    /// Appends text; never waits.
    pub fn push(&self, text: &str) {
        if !text.is_empty() {
            let _ = self.tx.send(Cmd::Text(text.to_owned()));
        }
    }

    /// Writes the final text with its status (`done`, `stopped`, `error`) and stats.
    pub async fn finish(
        self,
        status: Status,
        stats: MessageStats,
        error: Option<String>,
    ) -> Result<Message> {
        let (done, result) = oneshot::channel();
        let _ = self.tx.send(Cmd::Finish {
            status,
            stats,
            error,
            done,
        });
        match result.await {
            Ok(r) => r,
            Err(_) => Err(crate::Error::Io(std::io::Error::other(
                "the answer writer stopped",
            ))),
        }
    }
}

async fn run(store: Store, id: i64, mut text: String, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    // When the oldest unwritten text arrived; None when everything is on disk.
    let mut dirty_since: Option<Instant> = None;
    loop {
        let deadline = dirty_since.map(|t| t + FLUSH_EVERY);
        let cmd = tokio::select! {
            cmd = rx.recv() => cmd,
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)).await }, if deadline.is_some() => {
                flush(&store, id, &text, Status::Streaming).await;
                dirty_since = None;
                continue;
            }
        };
        match cmd {
            Some(Cmd::Text(t)) => {
                text.push_str(&t);
                dirty_since.get_or_insert_with(Instant::now);
            }
            Some(Cmd::Finish {
                status,
                stats,
                error,
                done,
            }) => {
                let r = store
                    .update_message(id, &text, status, &stats, error.as_deref())
                    .await;
                let _ = done.send(match r {
                    Ok(()) => store.message(id).await,
                    Err(e) => Err(e),
                });
                return;
            }
            None => {
                // Dropped without finishing: keep what we have, continuable.
                flush(&store, id, &text, Status::Interrupted).await;
                return;
            }
        }
    }
}

async fn flush(store: &Store, id: i64, text: &str, status: Status) {
    if let Err(e) = store
        .update_message(id, text, status, &MessageStats::default(), None)
        .await
    {
        // The text is still in memory and the next flush retries; the UI keeps showing it.
        tracing::warn!(message = id, error = %e, "could not write the streaming answer");
    }
}
