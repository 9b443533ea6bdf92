//! Export and import.
//!
//! JSON is lossless and versioned: the conversation with every message of every branch and
//! each answer's token probabilities (`message_tokens`), ids replaced by positions in the file (so an export → import → export round trip gives the same
//! bytes, whatever ids the new database hands out). A file from a newer Rill, or a damaged one,
//! is refused with a clear error and changes nothing (the import is one transaction). Secrets
//! never leave in an export: any `api_key` in the settings is left out (issue 13; the app keeps
//! keys apart from settings anyway). Nor does an import bring a server in: a `remote` backend
//! in an imported conversation's settings is dropped (issue 40), so opening a file someone
//! sent cannot make the app send the user's next messages to a server of the sender's choice;
//! the messages are kept, and the conversation answers with the model on this machine.
//! Images (issue 42) travel inside the JSON, each once, base64 under its SHA-256 (checked on
//! import), and the messages name them by hash. Markdown is for reading: the current branch,
//! one heading per turn, an answer's reasoning in a folded `<details>` block above it, an image
//! as a reference by its hash (`rill-image:…`; its bytes are in the JSON export).

use std::collections::{BTreeMap, HashMap};

use base64::Engine;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result, Role, Status, Store};

/// The JSON format this build writes, and the newest it reads. Version 2 added the messages'
/// `tokens`, version 3 their `reasoning` (with its token count and time), version 4 tool calls
/// and results (`tool_calls`, role `tool` with `tool_call_id`), version 5 speculative decoding's
/// counts (`draft_proposed`, `draft_accepted`), version 6 images (`images`); older files are
/// read as they are.
pub const EXPORT_VERSION: u32 = 6;
const FORMAT: &str = "rill-conversation";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportFile {
    format: String,
    version: u32,
    conversation: ExportConversation,
    messages: Vec<ExportMessage>,
    /// The images the messages show, by hash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    images: BTreeMap<String, ExportImage>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportImage {
    media_type: String,
    /// The bytes, base64.
    data: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportConversation {
    title: String,
    title_by_user: bool,
    created_at: i64,
    updated_at: i64,
    model: Option<String>,
    system_prompt: Option<String>,
    settings: Value,
    pinned: bool,
    archived: bool,
    /// Position of the current leaf in `messages`.
    current_leaf: Option<usize>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportMessage {
    /// Position in `messages`; parents come before their children.
    id: usize,
    parent: Option<usize>,
    role: Role,
    content: String,
    /// A thinking model's reasoning, when the answer had some.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reasoning: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reasoning_tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reasoning_ms: Option<f64>,
    /// Speculative decoding's draft tokens, proposed and accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    draft_proposed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    draft_accepted: Option<i64>,
    /// An assistant's tool calls: `[{"id", "name", "arguments"}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Value>,
    /// A tool result's call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    status: Status,
    model: Option<String>,
    settings: Option<Value>,
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    ttft_ms: Option<f64>,
    decode_tps: Option<f64>,
    error: Option<String>,
    created_at: i64,
    updated_at: i64,
    /// The answer's tokens with their candidates and probabilities, when it kept them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<Value>,
    /// The images it shows, by hash (in the file's `images`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    images: Vec<String>,
}

/// `v` without any `api_key` field, at any depth.
/// Settings as an import keeps them: no secrets, and no `remote` server (the module's docs).
fn imported_settings(v: Value) -> Value {
    let mut v = without_secrets(v);
    if let Value::Object(map) = &mut v {
        if map.remove("remote").is_some() {
            tracing::info!("an imported conversation named a remote server; it was dropped");
        }
    }
    v
}

fn without_secrets(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("api_key");
            for (_, x) in map.iter_mut() {
                *x = without_secrets(std::mem::take(x));
            }
        }
        Value::Array(items) => {
            for x in items.iter_mut() {
                *x = without_secrets(std::mem::take(x));
            }
        }
        _ => {}
    }
    v
}

impl Store {
    /// The whole conversation, every branch, as versioned JSON.
    pub async fn export_json(&self, conversation: i64) -> Result<String> {
        let c = self.conversation(conversation).await?;
        let messages = self.all_messages(conversation).await?;
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT t.message_id, t.tokens FROM message_tokens t JOIN messages m ON m.id = t.message_id
             WHERE m.conversation_id = ?",
        )
        .bind(conversation)
        .fetch_all(self.pool())
        .await?;
        let mut tokens: HashMap<i64, Value> = rows
            .into_iter()
            .filter_map(|(id, t)| Some((id, serde_json::from_str(&t).ok()?)))
            .collect();
        let mut images = BTreeMap::new();
        for hash in messages.iter().flat_map(|m| &m.images) {
            if !images.contains_key(hash) {
                let image = self.image(hash).await?;
                images.insert(
                    hash.clone(),
                    ExportImage {
                        media_type: image.media_type,
                        data: base64::engine::general_purpose::STANDARD.encode(&image.bytes),
                    },
                );
            }
        }
        let position: HashMap<i64, usize> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id, i))
            .collect();
        let file = ExportFile {
            format: FORMAT.into(),
            version: EXPORT_VERSION,
            conversation: ExportConversation {
                title: c.title,
                title_by_user: c.title_by_user,
                created_at: c.created_at,
                updated_at: c.updated_at,
                model: c.model,
                system_prompt: c.system_prompt,
                settings: without_secrets(c.settings),
                pinned: c.pinned,
                archived: c.archived,
                current_leaf: c.current_leaf_id.and_then(|l| position.get(&l).copied()),
            },
            messages: messages
                .into_iter()
                .enumerate()
                .map(|(i, m)| ExportMessage {
                    id: i,
                    parent: m.parent_id.and_then(|p| position.get(&p).copied()),
                    role: m.role,
                    content: m.content,
                    reasoning: m.reasoning,
                    reasoning_tokens: m.stats.reasoning_tokens,
                    reasoning_ms: m.stats.reasoning_ms,
                    draft_proposed: m.stats.draft_proposed,
                    draft_accepted: m.stats.draft_accepted,
                    tool_calls: m.tool_calls,
                    tool_call_id: m.tool_call_id,
                    status: m.status,
                    tokens: tokens.remove(&m.id),
                    model: m.model,
                    settings: m.settings.map(without_secrets),
                    prompt_tokens: m.stats.prompt_tokens,
                    completion_tokens: m.stats.completion_tokens,
                    ttft_ms: m.stats.ttft_ms,
                    decode_tps: m.stats.decode_tps,
                    error: m.error,
                    created_at: m.created_at,
                    updated_at: m.updated_at,
                    images: m.images,
                })
                .collect(),
            images,
        };
        Ok(serde_json::to_string_pretty(&file).unwrap_or_default())
    }

    /// Imports a JSON export as a new conversation; returns its id. All or nothing.
    pub async fn import_json(&self, json: &str) -> Result<i64> {
        let raw: Value =
            serde_json::from_str(json).map_err(|e| Error::Import(format!("not JSON: {e}")))?;
        if raw.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(Error::Import(
                "not a Rill conversation export (no \"format\": \"rill-conversation\")".into(),
            ));
        }
        let version = raw.get("version").and_then(Value::as_u64).unwrap_or(0);
        if version > EXPORT_VERSION as u64 {
            return Err(Error::Import(format!(
                "made by a newer Rill (format version {version}; this one reads up to {EXPORT_VERSION})"
            )));
        }
        let file: ExportFile = serde_json::from_value(raw)
            .map_err(|e| Error::Import(format!("malformed export: {e}")))?;
        for (i, m) in file.messages.iter().enumerate() {
            if m.id != i || m.parent.is_some_and(|p| p >= i) {
                return Err(Error::Import(format!(
                    "malformed export: message {i} has id {} and parent {:?}",
                    m.id, m.parent
                )));
            }
        }
        let c = &file.conversation;
        if c.current_leaf.is_some_and(|l| l >= file.messages.len()) {
            return Err(Error::Import(
                "malformed export: current_leaf points past the messages".into(),
            ));
        }

        // Every image named is in the file, and is what its hash says.
        let mut images: HashMap<&str, Vec<u8>> = HashMap::new();
        for (hash, image) in &file.images {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&image.data)
                .map_err(|e| Error::Import(format!("image {hash}: not base64: {e}")))?;
            if crate::image_hash(&bytes) != *hash {
                return Err(Error::Import(format!(
                    "image {hash}: its bytes do not have that hash (damaged)"
                )));
            }
            images.insert(hash, bytes);
        }
        if let Some(missing) = file
            .messages
            .iter()
            .flat_map(|m| &m.images)
            .find(|h| !images.contains_key(h.as_str()))
        {
            return Err(Error::Import(format!(
                "a message shows image {missing}, which the file does not hold"
            )));
        }

        let mut tx = self.write_tx().await?;
        let conversation = sqlx::query(
            "INSERT INTO conversations (title, title_by_user, created_at, updated_at, model, system_prompt, settings, pinned, archived)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&c.title)
        .bind(c.title_by_user)
        .bind(c.created_at)
        .bind(c.updated_at)
        .bind(&c.model)
        .bind(&c.system_prompt)
        .bind(imported_settings(c.settings.clone()).to_string())
        .bind(c.pinned)
        .bind(c.archived)
        .execute(&mut *tx)
        .await?
        .last_insert_rowid();
        let mut ids: Vec<i64> = Vec::with_capacity(file.messages.len());
        for m in &file.messages {
            let id = sqlx::query(
                "INSERT INTO messages (conversation_id, parent_id, role, content, reasoning, tool_calls,
                     tool_call_id, status, model, settings, prompt_tokens, completion_tokens, ttft_ms,
                     decode_tps, reasoning_tokens, reasoning_ms, draft_proposed, draft_accepted, error,
                     created_at, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(conversation)
            .bind(m.parent.map(|p| ids[p]))
            .bind(m.role)
            .bind(&m.content)
            .bind(&m.reasoning)
            .bind(m.tool_calls.as_ref().map(Value::to_string))
            .bind(&m.tool_call_id)
            // An answer exported while it streamed has no writer here: it is interrupted.
            .bind(match m.status {
                Status::Streaming => Status::Interrupted,
                s => s,
            })
            .bind(&m.model)
            .bind(m.settings.clone().map(|v| imported_settings(v).to_string()))
            .bind(m.prompt_tokens)
            .bind(m.completion_tokens)
            .bind(m.ttft_ms)
            .bind(m.decode_tps)
            .bind(m.reasoning_tokens)
            .bind(m.reasoning_ms)
            .bind(m.draft_proposed)
            .bind(m.draft_accepted)
            .bind(&m.error)
            .bind(m.created_at)
            .bind(m.updated_at)
            .execute(&mut *tx)
            .await?
            .last_insert_rowid();
            ids.push(id);
            let shown: Vec<Vec<u8>> = m
                .images
                .iter()
                .map(|h| images[h.as_str()].clone())
                .collect();
            crate::images::attach(&mut tx, id, &shown).await?;
            if let Some(t) = &m.tokens {
                sqlx::query("INSERT INTO message_tokens (message_id, tokens) VALUES (?, ?)")
                    .bind(id)
                    .bind(t.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
        }
        sqlx::query("UPDATE conversations SET current_leaf_id = ? WHERE id = ?")
            .bind(c.current_leaf.map(|l| ids[l]))
            .bind(conversation)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(conversation)
    }

    /// The current branch as Markdown, for reading and sharing.
    pub async fn export_markdown(&self, conversation: i64) -> Result<String> {
        let c = self.conversation(conversation).await?;
        let mut out = format!(
            "# {}\n\n",
            if c.title.is_empty() {
                "Untitled conversation"
            } else {
                &c.title
            }
        );
        if let Some(model) = &c.model {
            out.push_str(&format!("_Model: {model}_\n\n"));
        }
        if let Some(system) = c.system_prompt.as_deref().filter(|s| !s.trim().is_empty()) {
            out.push_str(&format!(
                "> **System:** {}\n\n",
                system.replace('\n', "\n> ")
            ));
        }
        for m in self.current_path(conversation).await? {
            let who = match m.role {
                Role::System => "System",
                Role::User => "User",
                Role::Assistant => "Assistant",
                Role::Tool => "Tool result",
            };
            let note = match m.status {
                Status::Done | Status::Streaming => String::new(),
                other => format!(
                    " _({})_",
                    serde_json::to_value(other)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                ),
            };
            out.push_str(&format!("## {who}{note}\n\n"));
            if !m.reasoning.trim().is_empty() {
                // A folded block, as the window shows it (GitHub and most viewers fold it).
                out.push_str(&format!(
                    "<details><summary>Thinking</summary>\n\n{}\n\n</details>\n\n",
                    m.reasoning.trim()
                ));
            }
            if m.role == Role::Tool {
                out.push_str(&format!("```json\n{}\n```\n\n", m.content.trim_end()));
                continue;
            }
            for (i, hash) in m.images.iter().enumerate() {
                out.push_str(&format!("![image {}](rill-image:{hash})\n\n", i + 1));
            }
            if !m.content.trim().is_empty() {
                out.push_str(&format!("{}\n\n", m.content.trim_end()));
            }
            for call in m
                .tool_calls
                .iter()
                .flat_map(|c| c.as_array().into_iter().flatten())
            {
                let name = call["name"].as_str().unwrap_or_default();
                let args = serde_json::to_string_pretty(&call["arguments"]).unwrap_or_default();
                out.push_str(&format!("**Call** `{name}`\n\n```json\n{args}\n```\n\n"));
            }
        }
        Ok(out)
    }
}
