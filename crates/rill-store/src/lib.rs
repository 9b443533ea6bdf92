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
mod lease;
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
            parent = Some(insert_message(&mut tx, id, parent, m).await?);
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

    /// Deletes a conversation and all its messages.
    pub async fn delete_conversation(&self, id: i64) -> Result<()> {
        let done = sqlx::query("DELETE FROM conversations WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::ConversationNotFound(id));
        }
        Ok(())
    }

    // ---- messages -----------------------------------------------------------------------

    /// Adds a message after the conversation's current leaf, and makes it the new leaf.
    pub async fn append(&self, conversation: i64, message: NewMessage) -> Result<Message> {
        let leaf = self.conversation(conversation).await?.current_leaf_id;
        self.add_child(conversation, leaf, message).await
    }

    /// Adds a message under `parent` (`None`: a new root) and makes it the current leaf. A
    /// second child of the same parent is a new branch; the old one stays.
    pub async fn add_child(
        &self,
        conversation: i64,
        parent: Option<i64>,
        message: NewMessage,
    ) -> Result<Message> {
        let mut tx = self.write_tx().await?;
        let id = insert_message(&mut tx, conversation, parent, &message).await?;
        tx.commit().await?;
        self.message(id).await
    }

    pub async fn message(&self, id: i64) -> Result<Message> {
        sqlx::query_as("SELECT * FROM messages WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(Error::MessageNotFound(id))
    }

    /// Every message of the conversation, every branch, in the order they were written.
    pub async fn all_messages(&self, conversation: i64) -> Result<Vec<Message>> {
        self.messages_as_json(
            "SELECT * FROM messages WHERE conversation_id = ?1 ORDER BY id",
            conversation,
        )
        .await
    }

    /// Runs `rows` (a query of whole message rows with one parameter) and fetches the result
    /// as one JSON array built by SQLite: for long conversations this is several times faster
    /// than decoding row by row (BENCHMARKS.md).
    async fn messages_as_json(&self, rows: &str, param: i64) -> Result<Vec<Message>> {
        let sql = format!(
            "SELECT COALESCE(json_group_array(json_object(
                 'id', id, 'conversation_id', conversation_id, 'parent_id', parent_id, 'role', role,
                 'content', content, 'status', status, 'model', model, 'settings', json(settings),
                 'prompt_tokens', prompt_tokens, 'completion_tokens', completion_tokens, 'ttft_ms', ttft_ms,
                 'decode_tps', decode_tps, 'error', error, 'created_at', created_at, 'updated_at', updated_at)), '[]')
             FROM ({rows})"
        );
        let json: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(param)
            .fetch_one(&self.pool)
            .await?;
        serde_json::from_str(&json)
            .map_err(|e| Error::Io(std::io::Error::other(format!("reading messages: {e}"))))
    }

    /// The conversation as shown and continued: root to current leaf.
    pub async fn current_path(&self, conversation: i64) -> Result<Vec<Message>> {
        match self.conversation(conversation).await?.current_leaf_id {
            Some(leaf) => self.path_to(leaf).await,
            None => Ok(Vec::new()),
        }
    }

    /// The messages from the root down to `message`.
    pub async fn path_to(&self, message: i64) -> Result<Vec<Message>> {
        self.messages_as_json(
            "WITH RECURSIVE path(id, depth) AS (
                 SELECT id, 0 FROM messages WHERE id = ?1
                 UNION ALL
                 SELECT m.parent_id, p.depth + 1 FROM messages m JOIN path p ON m.id = p.id WHERE m.parent_id IS NOT NULL
             )
             SELECT messages.* FROM messages JOIN path ON messages.id = path.id ORDER BY path.depth DESC",
            message,
        )
        .await
    }

    /// The ids of a message and its siblings (same parent), oldest first: the "2/3" arrows.
    pub async fn siblings(&self, message: i64) -> Result<Vec<i64>> {
        let m = self.message(message).await?;
        Ok(sqlx::query_scalar(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
        )
        .bind(m.conversation_id)
        .bind(m.parent_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Shows the branch through `message`: the leaf becomes its newest descendant (following
    /// the newest child at each step). Returns the new current path.
    pub async fn switch_branch(&self, message: i64) -> Result<Vec<Message>> {
        let m = self.message(message).await?;
        let leaf: i64 = sqlx::query_scalar(
            "WITH RECURSIVE down(id) AS (
                 SELECT ?
                 UNION ALL
                 SELECT (SELECT MAX(c.id) FROM messages c WHERE c.parent_id = down.id) FROM down
                 WHERE (SELECT MAX(c.id) FROM messages c WHERE c.parent_id = down.id) IS NOT NULL
             )
             SELECT MAX(id) FROM down",
        )
        .bind(message)
        .fetch_one(&self.pool)
        .await?;
        sqlx::query("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?")
            .bind(leaf)
            .bind(now_ms())
            .bind(m.conversation_id)
            .execute(&self.pool)
            .await?;
        self.path_to(leaf).await
    }

    /// Edits a message by adding a sibling with the new text (the original and everything after
    /// it stay, on their own branch). The new message becomes the leaf.
    pub async fn edit(&self, message: i64, content: &str) -> Result<Message> {
        let m = self.message(message).await?;
        let new = NewMessage {
            role: m.role,
            content: content.to_owned(),
            status: Status::Done,
            model: m.model,
            settings: m.settings,
        };
        self.add_child(m.conversation_id, m.parent_id, new).await
    }

    /// Replaces a message's text, status and stats.
    pub async fn update_message(
        &self,
        id: i64,
        content: &str,
        status: Status,
        stats: &MessageStats,
        error: Option<&str>,
    ) -> Result<()> {
        if self
            .set_message(id, None, content, status, stats, error)
            .await?
            == 0
        {
            return Err(Error::MessageNotFound(id));
        }
        Ok(())
    }

    /// Writes a message's text, status, stats (those given) and error; with `writer`, only if
    /// that writer still owns the row. Returns the rows written (0 or 1).
    pub(crate) async fn set_message(
        &self,
        id: i64,
        writer: Option<i64>,
        content: &str,
        status: Status,
        stats: &MessageStats,
        error: Option<&str>,
    ) -> Result<u64> {
        Ok(sqlx::query(
            "UPDATE messages SET content = ?, status = ?, prompt_tokens = COALESCE(?, prompt_tokens),
                 completion_tokens = COALESCE(?, completion_tokens), ttft_ms = COALESCE(?, ttft_ms),
                 decode_tps = COALESCE(?, decode_tps), error = ?, updated_at = ?
             WHERE id = ? AND (? IS NULL OR writer_token = ?)",
        )
        .bind(content)
        .bind(status)
        .bind(stats.prompt_tokens)
        .bind(stats.completion_tokens)
        .bind(stats.ttft_ms)
        .bind(stats.decode_tps)
        .bind(error)
        .bind(now_ms())
        .bind(id)
        .bind(writer)
        .bind(writer)
        .execute(&self.pool)
        .await?
        .rows_affected())
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

pub(crate) async fn insert_message(
    conn: &mut SqliteConnection,
    conversation: i64,
    parent: Option<i64>,
    m: &NewMessage,
) -> Result<i64> {
    let now = now_ms();
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM conversations WHERE id = ?")
        .bind(conversation)
        .fetch_optional(&mut *conn)
        .await?;
    if exists.is_none() {
        return Err(Error::ConversationNotFound(conversation));
    }
    if let Some(p) = parent {
        let owner: Option<i64> =
            sqlx::query_scalar("SELECT conversation_id FROM messages WHERE id = ?")
                .bind(p)
                .fetch_optional(&mut *conn)
                .await?;
        if owner != Some(conversation) {
            return Err(Error::MessageNotFound(p));
        }
    }
    let id = sqlx::query(
        "INSERT INTO messages (conversation_id, parent_id, role, content, status, model, settings, created_at, updated_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(conversation)
    .bind(parent)
    .bind(m.role)
    .bind(&m.content)
    .bind(m.status)
    .bind(&m.model)
    .bind(m.settings.as_ref().map(Value::to_string))
    .bind(now)
    .bind(now)
    .execute(&mut *conn)
    .await?
    .last_insert_rowid();
    sqlx::query("UPDATE conversations SET current_leaf_id = ?, updated_at = ? WHERE id = ?")
        .bind(id)
        .bind(now)
        .bind(conversation)
        .execute(&mut *conn)
        .await?;
    if m.role == Role::User {
        sqlx::query(
            "UPDATE conversations SET title = ? WHERE id = ? AND title_by_user = 0 AND title = ''",
        )
        .bind(title_from(&m.content))
        .bind(conversation)
        .execute(&mut *conn)
        .await?;
    }
    Ok(id)
}
