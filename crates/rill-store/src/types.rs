//! What the store holds: conversations, messages, their roles and statuses.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "TEXT", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant's call (`tool_call_id`).
    Tool,
}

/// Where a message stands. An answer is `streaming` while it is written; it ends `done`,
/// `stopped` (by the user: a partial answer is a real answer) or `error`; one left `streaming`
/// by a crash becomes `interrupted` when the store opens, and can be continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "TEXT", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Streaming,
    Done,
    Stopped,
    Interrupted,
    Error,
}

/// A conversation; its messages form a tree, and `current_leaf_id` is where it ends now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Conversation {
    pub id: i64,
    pub title: String,
    /// True once the user renamed it; until then the title follows the first user message.
    pub title_by_user: bool,
    pub created_at: i64,
    pub updated_at: i64,
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    /// Sampling settings (the panel's values), as JSON.
    #[sqlx(json)]
    pub settings: Value,
    pub pinned: bool,
    pub archived: bool,
    pub current_leaf_id: Option<i64>,
}

/// One message of a conversation's tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Message {
    pub id: i64,
    pub conversation_id: i64,
    pub parent_id: Option<i64>,
    pub role: Role,
    pub content: String,
    /// A thinking model's reasoning, apart from its answer (empty when it had none).
    #[serde(default)]
    pub reasoning: String,
    /// An assistant message's tool calls: a JSON array of `{"id", "name", "arguments"}`.
    #[sqlx(json(nullable))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// A tool message's call, by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    pub status: Status,
    pub model: Option<String>,
    #[sqlx(json(nullable))]
    pub settings: Option<Value>,
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub stats: MessageStats,
    pub error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The images a user message shows the model, in order, by hash ([`Store::image`](crate::Store::image)).
    #[sqlx(skip)]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
}

/// Token counts and speed of an answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct MessageStats {
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub ttft_ms: Option<f64>,
    pub decode_tps: Option<f64>,
    /// How many of the answer's tokens were reasoning, and how long it thought (ms).
    #[serde(default)]
    pub reasoning_tokens: Option<i64>,
    #[serde(default)]
    pub reasoning_ms: Option<f64>,
    /// Speculative decoding: draft tokens proposed, and how many the model drew.
    #[serde(default)]
    pub draft_proposed: Option<i64>,
    #[serde(default)]
    pub draft_accepted: Option<i64>,
}

/// What a new conversation starts with.
#[derive(Clone, Debug, Default)]
pub struct NewConversation {
    pub model: Option<String>,
    pub system_prompt: Option<String>,
    pub settings: Option<Value>,
}

/// A message to add.
#[derive(Clone, Debug)]
pub struct NewMessage {
    pub role: Role,
    pub content: String,
    pub status: Status,
    pub model: Option<String>,
    pub settings: Option<Value>,
    /// An assistant's calls (a JSON array of `{"id", "name", "arguments"}`).
    pub tool_calls: Option<Value>,
    /// For a [`Role::Tool`] result: the call it answers.
    pub tool_call_id: Option<String>,
    /// Images the message shows the model (a user's), their files' bytes, in order.
    pub images: Vec<Vec<u8>>,
}

impl NewMessage {
    /// A finished message of `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        NewMessage {
            role,
            content: content.into(),
            status: Status::Done,
            model: None,
            settings: None,
            tool_calls: None,
            tool_call_id: None,
            images: Vec::new(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// A tool's result for the call `id`.
    pub fn tool(id: impl Into<String>, content: impl Into<String>) -> Self {
        NewMessage {
            tool_call_id: Some(id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// One search result.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct SearchHit {
    pub conversation_id: i64,
    pub message_id: i64,
    pub title: String,
    pub role: Role,
    /// The matching passage, matches in [brackets].
    pub snippet: String,
    /// BM25 rank: lower is better.
    pub rank: f64,
}

/// A named set of sampling settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Preset {
    pub id: i64,
    pub name: String,
    #[sqlx(json)]
    pub settings: Value,
}
