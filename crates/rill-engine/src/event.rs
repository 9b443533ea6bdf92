//! What an answer reports while it runs ([`Event`], with its [`Usage`] and [`Timings`] at the
//! end) and what the engine reports of every live answer ([`Activity`]). Plain data: the
//! inference thread sends it, callers read it.

use serde::{Deserialize, Serialize};

use crate::sampler::Candidate;
use crate::scheduler::SequenceState;
use crate::stop::StopReason;

/// Token counts of a finished generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// How many of the answer's tokens were inside its thinking block (counted when the
    /// request split the reasoning apart; 0 otherwise).
    #[serde(default)]
    pub reasoning_tokens: usize,
    /// Speculative decoding: draft tokens proposed, and how many of them the model drew.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub draft_proposed: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub draft_accepted: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Speed of a finished generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// From the request to the first answer token.
    pub ttft_ms: f64,
    /// Prompt tokens per second.
    pub prefill_tps: f64,
    /// Answer tokens per second after the first.
    pub decode_tps: f64,
}

/// What a generation reports, in order: `Queued` (only while it waits for memory), `Started`,
/// `Token`… with a `Stats` now and then, then `Done` or `Error`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Waiting for KV-cache memory; `position` 0 is next.
    Queued { position: usize },
    /// Admitted: its prompt goes through the model now. `reused_tokens` came from the cache of
    /// an earlier answer; `dropped_messages` were cut from the front to fit the context.
    Started {
        prompt_tokens: usize,
        reused_tokens: usize,
        dropped_messages: usize,
    },
    /// Progress, every few tokens.
    Stats {
        completion_tokens: usize,
        tokens_per_second: f64,
        reused_tokens: usize,
    },
    /// One answer token and the text it completes (possibly empty: half a character, or text
    /// held back because it may begin a stop string). `candidates`: the likeliest tokens with
    /// their raw and sampled probabilities, when the request asked for them.
    Token {
        id: u32,
        text: String,
        /// The part of this token's text inside a thinking model's `<think>` block, when the
        /// request asked for it apart ([`GenerateRequest::split_reasoning`]); `text` then holds
        /// only the answer's content.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasoning: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        candidates: Vec<Candidate>,
        /// A draft proposed this token and the model drew it (speculative decoding): the
        /// window can tint such tokens.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drafted: bool,
    },
    /// The end, with why, how many tokens and how fast.
    Done {
        reason: StopReason,
        usage: Usage,
        timings: Timings,
    },
    /// The generation failed; nothing follows.
    Error { message: String },
}

/// What one live generation is doing, as of the last round: for an activity view.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Activity {
    pub id: u64,
    pub state: SequenceState,
    pub priority: u8,
    pub prompt_tokens: usize,
    /// Prompt tokens in the cache (reused or computed): prefill progress.
    pub prefilled: usize,
    pub completion_tokens: usize,
    /// Its share of the rows of recent forward passes, 0..1.
    pub share: f32,
}
