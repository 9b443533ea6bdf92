//! Writing an answer while it streams.
//!
//! [`Store::begin_answer`] and [`Store::resume_answer`] claim an answer row for one writer
//! (see [`crate::lease`]): a second writer on the same row is refused, in this process or
//! another, so a double click on Continue cannot start two generations that overwrite each
//! other (issue 13). A [`StreamWriter`] owns a small task that holds the answer's text and its
//! reasoning. Both are pushed without waiting (from any thread: the engine's token loop must
//! not block on the disk); the task writes them out at most 250 ms after the oldest unwritten
//! piece arrived, says it is alive every second, and writes once more at the end with the final
//! status and stats. A write that fails (a full disk, a locked file) is tried again 250 ms
//! later, and so is the final one, for a while. So a crash loses at most the last 250 ms of an
//! answer, and the store opens it as `interrupted`. If the writer is dropped without `finish`,
//! what it has is saved as `interrupted`.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::lease::{self, Claim};
use crate::{Error, Message, MessageStats, NewMessage, Result, Role, Status, Store};

/// The longest an answer's text stays only in memory.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How many times the final write is tried (every [`FLUSH_EVERY`]) before giving up.
const FINISH_TRIES: usize = 12;

enum Cmd {
    Text(String),
    Reasoning(String),
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

impl Store {
    /// Starts an answer under `parent` (status `streaming`), written as it grows.
    pub async fn begin_answer(
        &self,
        conversation: i64,
        parent: Option<i64>,
        model: Option<String>,
        settings: Option<serde_json::Value>,
    ) -> Result<StreamWriter> {
        let claim = Claim::new();
        let mut tx = self.write_tx().await?;
        let new = NewMessage {
            status: Status::Streaming,
            model,
            settings,
            ..NewMessage::new(Role::Assistant, "")
        };
        let id = crate::messages::insert_message(&mut tx, conversation, parent, &new).await?;
        sqlx::query(
            "UPDATE messages SET writer_pid = ?, writer_token = ?, writer_seen_at = ? WHERE id = ?",
        )
        .bind(lease::pid())
        .bind(claim.token)
        .bind(crate::now_ms())
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(StreamWriter::start(
            self.clone(),
            id,
            Texts::default(),
            claim,
        ))
    }

    /// Continues a `stopped` or `interrupted` answer in place: the text grows from what it
    /// has. Refused while the answer is being written (by this process or another) and for an
    /// answer that ended otherwise: one answer, one writer.
    pub async fn resume_answer(&self, message: i64) -> Result<StreamWriter> {
        let claim = Claim::new();
        let claimed = sqlx::query(
            "UPDATE messages SET status = 'streaming', error = NULL, writer_pid = ?, writer_token = ?,
                 writer_seen_at = ?, updated_at = ?
             WHERE id = ? AND role = 'assistant' AND status IN ('stopped', 'interrupted')",
        )
        .bind(lease::pid())
        .bind(claim.token)
        .bind(crate::now_ms())
        .bind(crate::now_ms())
        .bind(message)
        .execute(self.pool())
        .await?
        .rows_affected();
        let m = self.message(message).await?;
        if claimed == 0 {
            return Err(Error::NotContinuable {
                id: message,
                status: m.status,
            });
        }
        let texts = Texts {
            content: m.content,
            reasoning: m.reasoning,
        };
        Ok(StreamWriter::start(self.clone(), message, texts, claim))
    }

    /// Writes a streaming answer's text, if `token` still writes it.
    async fn write_streaming(&self, id: i64, token: i64, text: &Texts) -> Result<bool> {
        let now = crate::now_ms();
        Ok(sqlx::query(
            "UPDATE messages SET content = ?, reasoning = ?, writer_seen_at = ?, updated_at = ?
             WHERE id = ? AND writer_token = ? AND status = 'streaming'",
        )
        .bind(&text.content)
        .bind(&text.reasoning)
        .bind(now)
        .bind(now)
        .bind(id)
        .bind(token)
        .execute(self.pool())
        .await?
        .rows_affected()
            > 0)
    }

    async fn heartbeat(&self, id: i64, token: i64) -> Result<()> {
        sqlx::query(
            "UPDATE messages SET writer_seen_at = ? WHERE id = ? AND writer_token = ? AND status = 'streaming'",
        )
        .bind(crate::now_ms())
        .bind(id)
        .bind(token)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The final write of an answer, if `token` still owns it (nobody continued it since).
    async fn end_answer(
        &self,
        id: i64,
        token: i64,
        text: &Texts,
        status: Status,
        stats: &MessageStats,
        error: Option<&str>,
    ) -> Result<()> {
        let texts = (text.content.as_str(), Some(text.reasoning.as_str()));
        let written = self
            .set_message(id, Some(token), texts, status, stats, error)
            .await?;
        if written == 0 {
            self.message(id).await?; // gone: MessageNotFound
            return Err(Error::NotContinuable {
                id,
                status: Status::Streaming,
            });
        }
        Ok(())
    }
}

/// What a streaming answer has so far: its content and its reasoning.
#[derive(Default)]
struct Texts {
    content: String,
    reasoning: String,
}

impl StreamWriter {
    fn start(store: Store, message_id: i64, initial: Texts, claim: Claim) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(store, message_id, initial, rx, claim));
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

    /// Appends reasoning (a thinking model's thoughts, kept apart from the text); never waits.
    pub fn push_reasoning(&self, text: &str) {
        if !text.is_empty() {
            let _ = self.tx.send(Cmd::Reasoning(text.to_owned()));
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

async fn run(
    store: Store,
    id: i64,
    mut text: Texts,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
    claim: Claim,
) {
    let token = claim.token;
    // When the oldest unwritten text arrived; None when everything is on disk.
    let mut dirty_since: Option<Instant> = None;
    let mut beat = tokio::time::interval(lease::HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let deadline = dirty_since.map(|t| t + FLUSH_EVERY);
        let cmd = tokio::select! {
            cmd = rx.recv() => cmd,
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)).await }, if deadline.is_some() => {
                // Only a write that happened clears the deadline: a failed one is tried again
                // in FLUSH_EVERY, whether or not more text comes (issue 13).
                dirty_since = match store.write_streaming(id, token, &text).await {
                    Ok(true) => None,
                    Ok(false) => {
                        tracing::warn!(message = id, "another writer took the answer over; this one stops writing");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(message = id, error = %e, "could not write the streaming answer; trying again");
                        Some(Instant::now())
                    }
                };
                continue;
            }
            _ = beat.tick() => {
                if let Err(e) = store.heartbeat(id, token).await {
                    tracing::debug!(message = id, error = %e, "heartbeat not written");
                }
                continue;
            }
        };
        match cmd {
            Some(Cmd::Text(t)) => {
                text.content.push_str(&t);
                dirty_since.get_or_insert_with(Instant::now);
            }
            Some(Cmd::Reasoning(t)) => {
                text.reasoning.push_str(&t);
                dirty_since.get_or_insert_with(Instant::now);
            }
            Some(Cmd::Finish {
                status,
                stats,
                error,
                done,
            }) => {
                let mut tries = 0;
                let r = loop {
                    tries += 1;
                    let r = store
                        .end_answer(id, token, &text, status, &stats, error.as_deref())
                        .await;
                    match r {
                        Err(Error::Db(e)) if tries < FINISH_TRIES => {
                            tracing::warn!(message = id, error = %e, "could not finish the answer; trying again");
                            tokio::time::sleep(FLUSH_EVERY).await;
                        }
                        r => break r,
                    }
                };
                let _ = done.send(match r {
                    Ok(()) => store.message(id).await,
                    Err(e) => Err(e),
                });
                return;
            }
            None => {
                // Dropped without finishing: keep what we have, continuable.
                let r = store
                    .end_answer(
                        id,
                        token,
                        &text,
                        Status::Interrupted,
                        &MessageStats::default(),
                        None,
                    )
                    .await;
                if let Err(e) = r {
                    tracing::warn!(message = id, error = %e, "could not keep the unfinished answer");
                }
                return;
            }
        }
    }
}
