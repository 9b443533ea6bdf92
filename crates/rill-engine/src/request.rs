//! What callers ask the engine for: a [`GenerateRequest`] (the prompt, its sampling settings and
//! everything else an answer may be given), a [`PreviewRequest`] for the next-token chart, and
//! the settings they are made of. Plain data at the ground of the crate: nothing here runs.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::constraint::Grammar;
use crate::sampler::SamplingParams;
use crate::template::Message;

/// The largest priority: an answer at priority p takes part in the first p passes of a round,
/// so an unbounded one would hold prefill and cancellation back for as many passes (issue 13).
/// The window offers 1×–4×.
pub const MAX_PRIORITY: u8 = 4;

/// The most candidates a request may ask to see per token.
pub const MAX_CANDIDATES: usize = 50;

/// What to generate from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template; the answer continues it.
    Messages(Vec<Message>),
    /// Raw text, tokenized as it is (plus BOS when the model wants one).
    Text(String),
    /// Raw text in which each of `images` stands as [`IMAGE_MARKER`](crate::message::IMAGE_MARKER),
    /// in order: an answer continued after a conversation with pictures (the conversation
    /// rendered by [`Handle::render_chat_marked`](crate::Handle::render_chat_marked), the
    /// partial answer after it). The images are carried beside, not in this type's JSON.
    Pictured {
        text: String,
        #[serde(skip)]
        images: Vec<crate::message::ImageData>,
    },
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// One request for a generation.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// Strings that end the answer; never emitted.
    pub stop: Vec<String>,
    /// At most this many answer tokens; `None` = until the model stops or the context is full.
    pub max_tokens: Option<usize>,
    /// Decode steps per round relative to others (1 = equal share; at most [`MAX_PRIORITY`]).
    pub priority: u8,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// What to do when a conversation does not fit the context.
    pub overflow: Overflow,
    /// Report the likeliest candidates (raw and sampled probabilities) with every token; 0
    /// (the default) costs nothing.
    pub top_candidates: usize,
    /// What the answer must match (a JSON schema, any JSON object, a Lark grammar); `None`
    /// leaves it free. A grammar that cannot be used is refused by [`Handle::generate`](crate::Handle::generate).
    pub grammar: Option<Grammar>,
    /// Give a thinking model's reasoning (its `<think>` block) apart from the answer's content,
    /// in `Event::Token`'s `reasoning`; without it the block stays in the text.
    pub split_reasoning: bool,
    /// With `split_reasoning`: close the thinking block after this many tokens of it (the
    /// model goes on with its answer); `None` lets it think as long as it likes.
    pub thinking_budget: Option<usize>,
    /// With `split_reasoning`, for an answer continued from a partial one whose text ends the
    /// prompt: whether it stopped inside its thinking block (`Some(true)`) or in its content.
    /// `None` (a new answer) reads it from the prompt: inside when it ends by opening a block.
    pub continues_reasoning: Option<bool>,
    /// Speculative decoding: how the answer's next tokens are proposed for the model to
    /// check several at a time (the same text, sooner).
    pub speculation: Speculation,
    /// For a conversation: the tools and template variables its chat template is given.
    /// With tools, the answer's text keeps the format's marker tokens
    /// ([`crate::tools::ToolFormat::markers`]) for the caller's tool parser.
    pub chat: ChatArgs,
}

/// Context-overflow policy for a conversation longer than the context window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Keep the system prompt, drop the oldest turns until the rest fits with room to answer.
    #[default]
    DropOldest,
    /// Refuse (`Error::PromptTooLong`); an answer that fills the context ends with `ContextFull`.
    Stop,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            params: SamplingParams::default(),
            stop: Vec::new(),
            max_tokens: None,
            priority: 1,
            ignore_eos: false,
            overflow: Overflow::DropOldest,
            top_candidates: 0,
            grammar: None,
            split_reasoning: false,
            thinking_budget: None,
            continues_reasoning: None,
            speculation: Speculation::Off,
            chat: ChatArgs::default(),
        }
    }

    pub fn chat(messages: Vec<Message>) -> Self {
        Self::new(Prompt::Messages(messages))
    }
}

/// What a conversation's chat template is given besides the messages.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatArgs {
    /// Tools the model may call, as OpenAI's API lists them; empty for none.
    pub tools: Vec<Value>,
    /// More template variables (OpenAI's `chat_template_kwargs`: `enable_thinking`,
    /// `reasoning_effort`, …).
    pub kwargs: Map<String, Value>,
}

/// Asks for the next-token distribution after a prompt, without generating.
#[derive(Clone, Debug)]
pub struct PreviewRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// How many of the likeliest tokens to report (at most [`MAX_CANDIDATES`]).
    pub top: usize,
}

/// How an answer's next tokens are proposed for the model to check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Speculation {
    /// One token per pass.
    #[default]
    Off,
    /// Prompt lookup: the continuation of an earlier occurrence of the last few tokens.
    Lookup,
    /// The engine's draft model (`--draft-model`) proposes: its greedy continuation.
    Draft,
    /// For tests and benchmarks: drafts the model rejects (the prompt's first token, a turn
    /// marker no answer writes), to show that checking costs little when drafts fail. Never
    /// read from settings or requests.
    #[serde(skip)]
    Contrary,
}
