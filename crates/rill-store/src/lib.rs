//! # rill-store
//!
//! Every conversation in one SQLite file, through sqlx: a tree of messages (an edit or a
//! regenerate adds a branch, nothing is overwritten), answers written while they stream
//! ([`StreamWriter`], at least every 250 ms, so a crash loses at most that), full-text search
//! (FTS5, kept in step by triggers), and export/import (lossless JSON, readable Markdown).
//!
//! The file is opened in WAL mode with foreign keys on and a busy timeout, and every write that
//! takes more than one statement starts with `BEGIN IMMEDIATE`, so the app and the API can write
//! to it at the same time without "database is locked" reaching anyone. On open, migrations
//! from `migrations/` are applied and answers left `streaming` by a writer that is gone (a
//! crash) become `interrupted`; answers another program is writing are left alone.
//!
//! The crate knows nothing of the engine: callers pass text and numbers.

mod error;
mod export;
mod images;
mod lease;
mod messages;
mod search;
mod types;
mod writer;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};

pub use error::{Error, Result};
pub use export::EXPORT_VERSION;
pub use images::{image_hash, StoredImage};
pub use types::{
    Conversation, Message, MessageStats, NewConversation, NewMessage, Preset, Role, SearchHit,
    Status,
};
pub use writer::StreamWriter;

/// Longest title taken from a first message.
const TITLE_CHARS: usize = 60;

/// A handle on the database file; cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    path: PathBuf,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A title from the first user message: its first line, trimmed, at most 60 characters.
pub fn title_from(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    title
}

impl Store {
    /// Opens (or creates) the database at `path`. A file that is not SQLite is refused and left
    /// exactly as it was.
    pub async fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        if let Ok(file) = std::fs::File::open(&path) {
            use std::io::Read;
            // The header only (SQLite's first 16 bytes), not the whole file.
            let mut head = Vec::with_capacity(16);
            file.take(16).read_to_end(&mut head)?;
            if !head.is_empty() && head != b"SQLite format 3\0" {
                return Err(Error::NotADatabase { path });
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| match e {
                sqlx::Error::Database(d) if d.message().contains("not a database") => {
                    Error::NotADatabase { path: path.clone() }
                }
                e => Error::Db(e),
            })?;
        match sqlx::migrate!("./migrations").run(&pool).await {
            Ok(()) => {}
            Err(sqlx::migrate::MigrateError::VersionMissing(_)) => {
                return Err(Error::NewerSchema { path })
            }
            Err(sqlx::migrate::MigrateError::Execute(sqlx::Error::Database(d)))
                if d.message().contains("not a database") =>
            {
                return Err(Error::NotADatabase { path });
            }
            Err(e) => return Err(e.into()),
        }
        let store = Store { pool, path };
        let recovered = store.recover_abandoned().await?;
        if recovered > 0 {
            tracing::info!(
                recovered,
                "answers whose writer is gone (a crash) marked interrupted"
            );
        }
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A write transaction that takes the write lock at once (`BEGIN IMMEDIATE`), so a
    /// concurrent writer waits on the busy timeout instead of failing with SQLITE_BUSY.
    pub(crate) async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    // ---- conversations ------------------------------------------------------------------

    pub async fn create_conversation(&self, new: NewConversation) -> Result<Conversation> {
        let mut conn = self.pool.acquire().await?;
        let id = insert_conversation(&mut conn, new).await?;
        drop(conn);
        self.conversation(id).await
    }

    /// Writes a whole conversation in one transaction: a reader sees all of it or none of it.
    /// `messages` form one branch in order; the last one's `stats` are kept (an answer's
    /// token counts and speed). Returns the new conversation's id.
    pub async fn save_conversation(
        &self,
        new: NewConversation,
        messages: &[NewMessage],
        last_stats: &MessageStats,
    ) -> Result<i64> {
        let mut tx = self.write_tx().await?;
        let id = insert_conversation(&mut tx, new).await?;
        let mut parent = None;
        for m in messages {
            parent = Some(messages::insert_message(&mut tx, id, parent, m).await?);
        }
        if let Some(last) = parent {
            sqlx::query(
                "UPDATE messages SET prompt_tokens = ?, completion_tokens = ?, ttft_ms = ?, decode_tps = ? WHERE id = ?",
            )
            .bind(last_stats.prompt_tokens)
            .bind(last_stats.completion_tokens)
            .bind(last_stats.ttft_ms)
            .bind(last_stats.decode_tps)
            .bind(last)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    pub async fn conversation(&self, id: i64) -> Result<Conversation> {
        sqlx::query_as("SELECT * FROM conversations WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(Error::ConversationNotFound(id))
    }

    /// Pinned first, then the most recently updated.
    pub async fn list_conversations(&self, include_archived: bool) -> Result<Vec<Conversation>> {
        Ok(sqlx::query_as(
            "SELECT * FROM conversations WHERE archived = 0 OR ? ORDER BY pinned DESC, updated_at DESC, id DESC",
        )
        .bind(include_archived)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn update_conversation(
        &self,
        id: i64,
        sql: &'static str,
        value: impl for<'q> sqlx::Encode<'q, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> + Send,
    ) -> Result<()> {
        let done = sqlx::query(sql)
            .bind(value)
            .bind(now_ms())
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::ConversationNotFound(id));
        }
        Ok(())
    }

    /// Renames; the title no longer follows the first message.
    pub async fn rename(&self, id: i64, title: &str) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET title = ?, title_by_user = 1, updated_at = ? WHERE id = ?",
            title.trim().to_owned(),
        )
        .await
    }

    pub async fn set_pinned(&self, id: i64, pinned: bool) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET pinned = ?, updated_at = ? WHERE id = ?",
            pinned,
        )
        .await
    }

    pub async fn set_archived(&self, id: i64, archived: bool) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET archived = ?, updated_at = ? WHERE id = ?",
            archived,
        )
        .await
    }

    /// The sampling settings this conversation uses from now on.
    pub async fn set_settings(&self, id: i64, settings: &Value) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET settings = ?, updated_at = ? WHERE id = ?",
            settings.to_string(),
        )
        .await
    }

    pub async fn set_system_prompt(&self, id: i64, prompt: Option<&str>) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET system_prompt = ?, updated_at = ? WHERE id = ?",
            prompt.map(str::to_owned),
        )
        .await
    }

    pub async fn set_model(&self, id: i64, model: Option<&str>) -> Result<()> {
        self.update_conversation(
            id,
            "UPDATE conversations SET model = ?, updated_at = ? WHERE id = ?",
            model.map(str::to_owned),
        )
        .await
    }

    /// Deletes a conversation and all its messages, and the images no other message shows.
    pub async fn delete_conversation(&self, id: i64) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query("DELETE FROM conversations WHERE id = ?")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::ConversationNotFound(id));
        }
        images::drop_unshown(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    // ---- presets and settings -----------------------------------------------------------

    pub async fn presets(&self) -> Result<Vec<Preset>> {
        Ok(sqlx::query_as("SELECT * FROM presets ORDER BY name")
            .fetch_all(&self.pool)
            .await?)
    }

    /// Saves (or replaces) a named preset.
    pub async fn save_preset(&self, name: &str, settings: &Value) -> Result<()> {
        sqlx::query("INSERT INTO presets (name, settings) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET settings = excluded.settings")
            .bind(name)
            .bind(settings.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn delete_preset(&self, name: &str) -> Result<()> {
        sqlx::query("DELETE FROM presets WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Keeps an answer's per-token probabilities (replacing what it had).
    pub async fn set_message_tokens(&self, message: i64, tokens: &Value) -> Result<()> {
        sqlx::query(
            "INSERT INTO message_tokens (message_id, tokens) VALUES (?, ?) \
             ON CONFLICT(message_id) DO UPDATE SET tokens = excluded.tokens",
        )
        .bind(message)
        .bind(tokens.to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// An answer's per-token probabilities; `None` when none were kept.
    pub async fn message_tokens(&self, message: i64) -> Result<Option<Value>> {
        let raw: Option<String> =
            sqlx::query_scalar("SELECT tokens FROM message_tokens WHERE message_id = ?")
                .bind(message)
                .fetch_optional(&self.pool)
                .await?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    pub async fn setting(&self, key: &str) -> Result<Option<Value>> {
        let raw: Option<String> =
            sqlx::query_scalar("SELECT value FROM app_settings WHERE key = ?")
                .bind(key)
                .fetch_optional(&self.pool)
                .await?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    pub async fn set_setting(&self, key: &str, value: &Value) -> Result<()> {
        sqlx::query("INSERT INTO app_settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Inserts a message inside a write transaction: makes it the leaf, bumps the conversation,
/// and titles the conversation from its first user message unless the user named it.
async fn insert_conversation(conn: &mut SqliteConnection, new: NewConversation) -> Result<i64> {
    let now = now_ms();
    Ok(sqlx::query(
        "INSERT INTO conversations (created_at, updated_at, model, system_prompt, settings) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(now)
    .bind(now)
    .bind(&new.model)
    .bind(&new.system_prompt)
    .bind(new.settings.unwrap_or_else(|| Value::Object(Default::default())).to_string())
    .execute(&mut *conn)
    .await?
    .last_insert_rowid())
}
