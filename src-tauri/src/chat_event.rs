//! What an answer's channel carries to the page ([`ChatEvent`]), whether the answer comes from
//! this machine's engine or from a remote server.

use rill_engine::Event;
use rill_store::Message;
use serde::Serialize;

/// What an answer's channel carries, in order: maybe `queued`, `started`, `token`s with
/// `stats` now and then, then `done` (the saved message) or `error`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", content = "data", rename_all = "snake_case")]
pub enum ChatEvent {
    Queued {
        position: usize,
    },
    Started {
        prompt_tokens: usize,
        reused_tokens: usize,
        dropped_messages: usize,
    },
    Token {
        text: String,
        /// A thinking model's reasoning in this token (its `<think>` block), apart from `text`.
        #[serde(skip_serializing_if = "String::is_empty")]
        reasoning: String,
        /// The token's candidates, when the panel keeps token probabilities.
        #[serde(skip_serializing_if = "Option::is_none")]
        probs: Option<rill_chat::TokenProbs>,
        /// A draft proposed it and the model drew it (speculative decoding).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        drafted: bool,
    },
    Stats {
        completion_tokens: usize,
        tokens_per_second: f64,
    },
    Done {
        message: Box<Message>,
    },
    Error {
        message: String,
    },
}

impl ChatEvent {
    /// The page's event for an engine event (with the token's candidates, when kept); `None`
    /// for what the page is not sent (an empty token, the engine's own end: the saved message
    /// follows instead).
    pub fn of(e: &Event, probs: Option<&rill_chat::TokenProbs>) -> Option<ChatEvent> {
        Some(match e {
            Event::Queued { position } => ChatEvent::Queued {
                position: *position,
            },
            Event::Started {
                prompt_tokens,
                reused_tokens,
                dropped_messages,
            } => ChatEvent::Started {
                prompt_tokens: *prompt_tokens,
                reused_tokens: *reused_tokens,
                dropped_messages: *dropped_messages,
            },
            Event::Token {
                text,
                reasoning,
                candidates,
                drafted,
                ..
            } if !text.is_empty() || !reasoning.is_empty() || !candidates.is_empty() => {
                ChatEvent::Token {
                    text: text.clone(),
                    reasoning: reasoning.clone(),
                    probs: probs.cloned(),
                    drafted: *drafted,
                }
            }
            Event::Stats {
                completion_tokens,
                tokens_per_second,
                ..
            } => ChatEvent::Stats {
                completion_tokens: *completion_tokens,
                tokens_per_second: *tokens_per_second,
            },
            _ => return None,
        })
    }
}
