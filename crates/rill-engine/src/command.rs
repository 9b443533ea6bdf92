//! What crosses from the handles to the inference thread: the [`Command`]s it obeys and the
//! [`Shared`] state both sides read (the model's text side, counters the thread keeps up to
//! date). Crate-private: callers see only [`crate::Handle`] and [`crate::Control`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use candle_core::Device;
use tokio::sync::oneshot;

use crate::constraint::Grammars;
use crate::draft::{DraftInfo, DraftModel};
use crate::error::Result;
use crate::event::Activity;
use crate::model::ModelInfo;
use crate::sampler::{Distribution, SamplingParams};
use crate::sequence::Sequence;
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// A message to the inference thread.
pub(crate) enum Command {
    Add(Box<Sequence>),
    Preview(Box<PreviewJob>),
    SetParams(u64, SamplingParams),
    Pause(u64),
    Resume(u64),
    Cancel(u64),
    SetPriority(u64, u8),
    SetMaxTokens(u64, Option<usize>),
    /// A new draft model, or none.
    SetDraft(Option<Box<DraftModel>>),
    Shutdown,
    /// Makes the inference thread panic: for the test that it recovers (`worker_tests.rs`).
    #[cfg(test)]
    Panic,
}

/// A preview on its way to the inference thread.
pub(crate) struct PreviewJob {
    pub(crate) seq: Sequence,
    pub(crate) reply: oneshot::Sender<Result<Distribution>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// What every handle shares: the model's text side and counters the thread keeps up to date.
pub(crate) struct Shared {
    pub(crate) info: ModelInfo,
    /// Bytes of weights a decode step reads, held and in the file (`Decoder::step_weight_bytes`).
    pub(crate) step_weight_bytes: (usize, usize),
    /// Multiply-adds of a prompt row in the layers' matrices (`Decoder::prompt_row_macs`).
    pub(crate) prompt_row_macs: usize,
    /// The compute pool's threads.
    pub(crate) threads: usize,
    pub(crate) tokenizer: Arc<Tokenizer>,
    /// Compiles the grammars of constrained answers (its token trie is built on first use).
    pub(crate) grammars: Grammars,
    pub(crate) template: ChatTemplate,
    pub(crate) context_length: usize,
    pub(crate) next_id: AtomicU64,
    pub(crate) cache_bytes: AtomicUsize,
    pub(crate) prefix_bytes: AtomicUsize,
    /// The generations the thread holds, as of the last round (previews excluded).
    pub(crate) live: Mutex<Vec<Activity>>,
    /// Where the model runs (a draft model is loaded onto it too).
    pub(crate) device: Device,
    /// The draft model, when one is loaded.
    pub(crate) draft: Mutex<Option<DraftInfo>>,
    /// Weights read in the file's map whose panels are still to be made (`kernels/later.rs`).
    pub(crate) panels_pending: AtomicBool,
    /// Bytes of weights locked in memory ([`EngineConfig::lock_weights`]).
    pub(crate) locked_weight_bytes: usize,
    /// The vision projector paired with the model, when there is one.
    pub(crate) vision: Option<crate::vision::Vision>,
}
