//! Messages: the conversation's tree (append, branch, edit, switch), reading paths through it,
//! and writing a message's text, reasoning, status and stats.

use serde_json::Value;
use sqlx::SqliteConnection;

use crate::{
    now_ms, title_from, Error, Message, MessageStats, NewMessage, Result, Role, Status, Store,
};

impl Store {
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
        let mut m: Message = sqlx::query_as("SELECT * FROM messages WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(Error::MessageNotFound(id))?;
        m.images = self.message_image_hashes(id).await?;
        Ok(m)
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
                 'content', content, 'reasoning', reasoning, 'tool_calls', json(tool_calls),
                 'tool_call_id', tool_call_id, 'status', status, 'model', model,
                 'settings', json(settings), 'prompt_tokens', prompt_tokens,
                 'completion_tokens', completion_tokens, 'ttft_ms', ttft_ms, 'decode_tps', decode_tps,
                 'reasoning_tokens', reasoning_tokens, 'reasoning_ms', reasoning_ms,
                 'draft_proposed', draft_proposed, 'draft_accepted', draft_accepted,
                 'error', error, 'created_at', created_at, 'updated_at', updated_at,
                 'images', (SELECT json_group_array(image_hash) FROM
                     (SELECT image_hash FROM message_images WHERE message_id = id
                      ORDER BY position)))), '[]')
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
        let mut images = Vec::with_capacity(m.images.len());
        for hash in &m.images {
            images.push(self.image(hash).await?.bytes);
        }
        // The edit shows the same images (stored once: only their places are new).
        let new = NewMessage {
            model: m.model,
            settings: m.settings,
            tool_call_id: m.tool_call_id,
            images,
            ..NewMessage::new(m.role, content)
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
            .set_message(id, None, (content, None), status, stats, error)
            .await?
            == 0
        {
            return Err(Error::MessageNotFound(id));
        }
        Ok(())
    }

    /// An answer's tool calls once they are read from its text, and the text left besides them
    /// (a JSON array of `{"id", "name", "arguments"}`).
    pub async fn set_tool_calls(&self, id: i64, content: &str, calls: &Value) -> Result<()> {
        let written = sqlx::query(
            "UPDATE messages SET content = ?, tool_calls = ?, updated_at = ? WHERE id = ?",
        )
        .bind(content)
        .bind(calls.to_string())
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if written == 0 {
            return Err(Error::MessageNotFound(id));
        }
        Ok(())
    }

    /// Writes a message's text (its content, and its reasoning when given), status, stats
    /// (those given) and error; with `writer`, only if that writer still owns the row. Returns
    /// the rows written (0 or 1).
    pub(crate) async fn set_message(
        &self,
        id: i64,
        writer: Option<i64>,
        (content, reasoning): (&str, Option<&str>),
        status: Status,
        stats: &MessageStats,
        error: Option<&str>,
    ) -> Result<u64> {
        Ok(sqlx::query(
            "UPDATE messages SET content = ?, reasoning = COALESCE(?, reasoning), status = ?,
                 prompt_tokens = COALESCE(?, prompt_tokens),
                 completion_tokens = COALESCE(?, completion_tokens), ttft_ms = COALESCE(?, ttft_ms),
                 decode_tps = COALESCE(?, decode_tps),
                 reasoning_tokens = COALESCE(?, reasoning_tokens),
                 reasoning_ms = COALESCE(?, reasoning_ms),
                 draft_proposed = COALESCE(?, draft_proposed),
                 draft_accepted = COALESCE(?, draft_accepted), error = ?, updated_at = ?
             WHERE id = ? AND (? IS NULL OR writer_token = ?)",
        )
        .bind(content)
        .bind(reasoning)
        .bind(status)
        .bind(stats.prompt_tokens)
        .bind(stats.completion_tokens)
        .bind(stats.ttft_ms)
        .bind(stats.decode_tps)
        .bind(stats.reasoning_tokens)
        .bind(stats.reasoning_ms)
        .bind(stats.draft_proposed)
        .bind(stats.draft_accepted)
        .bind(error)
        .bind(now_ms())
        .bind(id)
        .bind(writer)
        .bind(writer)
        .execute(&self.pool)
        .await?
        .rows_affected())
    }
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
        "INSERT INTO messages (conversation_id, parent_id, role, content, status, model, settings,
             tool_calls, tool_call_id, created_at, updated_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(conversation)
    .bind(parent)
    .bind(m.role)
    .bind(&m.content)
    .bind(m.status)
    .bind(&m.model)
    .bind(m.settings.as_ref().map(Value::to_string))
    .bind(m.tool_calls.as_ref().map(Value::to_string))
    .bind(&m.tool_call_id)
    .bind(now)
    .bind(now)
    .execute(&mut *conn)
    .await?
    .last_insert_rowid();
    crate::images::attach(conn, id, &m.images).await?;
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
