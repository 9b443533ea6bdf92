//! The inference thread and the [`Handle`] the rest of the app uses.
//!
//! [`Engine::start`] loads the model and spawns one plain OS thread (compute must not starve an
//! async runtime) that owns the weights and every live [`Sequence`](crate::sequence). Requests
//! and control messages reach it through a channel; each generation's events leave through a
//! channel of its own, which the caller holds as a [`Generation`]. Dropping a `Generation`
//! cancels it and frees its cache (DESIGN.md, style rules 5 and 6).
//!
//! Work that can fail on bad input — validating parameters, rendering the chat template,
//! tokenizing, checking the context — happens in [`Handle::generate`] on the caller's thread,
//! so the caller gets the error at once and the inference thread only ever sees valid work.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::Device;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::oneshot;

use crate::config::{available_memory, DEFAULT_CONTEXT_CAP};
pub use crate::config::{DeviceKind, EngineConfig};
use crate::constraint::{Grammar, Grammars};
use crate::error::{Error, Result};
pub use crate::generation::{Collected, Control, Generation};
use crate::model::{Model, ModelInfo};
pub use crate::preview::PreviewRequest;
pub use crate::prompting::ChatArgs;
use crate::reasoning::ReasoningSplit;
use crate::sampler::{Candidate, Distribution, Sampler, SamplingParams};
use crate::scheduler::SequenceState;
use crate::sequence::{Sequence, SequenceSpec, Speculation};
use crate::stop::{StopReason, StopStrings};
use crate::template::{ChatTemplate, Message};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::tools::ToolFormat;
use crate::worker::{self, Worker};

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
    /// leaves it free. A grammar that cannot be used is refused by [`Handle::generate`].
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
    SetDraft(Option<Box<crate::draft::DraftModel>>),
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

/// What every handle shares: the model's text side and counters the thread keeps up to date.
pub(crate) struct Shared {
    pub(crate) info: ModelInfo,
    /// Bytes of weights a decode step reads, held and in the file (`Llama::step_weight_bytes`).
    pub(crate) step_weight_bytes: (usize, usize),
    /// Multiply-adds of a prompt row in the layers' matrices (`Llama::prompt_row_macs`).
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
    pub(crate) draft: Mutex<Option<crate::draft::DraftInfo>>,
    /// Weights read in the file's map whose panels are still to be made (`kernels/later.rs`).
    pub(crate) panels_pending: std::sync::atomic::AtomicBool,
    /// Bytes of weights locked in memory ([`EngineConfig::lock_weights`]).
    pub(crate) locked_weight_bytes: usize,
}

/// A running engine. Dropping it stops the inference thread (after the current step).
pub struct Engine {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Loads the model and starts the inference thread.
    pub fn start(config: EngineConfig) -> Result<Engine> {
        if config.prefill_chunk == 0 {
            return Err(Error::param("prefill_chunk", "must be ≥ 1"));
        }
        if config.threads == Some(0) {
            return Err(Error::param("threads", "must be ≥ 1"));
        }
        // Physical cores: hyper-threads share the SIMD units the matmuls saturate.
        let threads = config
            .threads
            .unwrap_or_else(|| num_cpus::get_physical().max(1));
        let device = config.device.device()?;
        let cap = config.context_size.unwrap_or(DEFAULT_CONTEXT_CAP);
        if cap == 0 {
            return Err(Error::param("context_size", "must be ≥ 1"));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("rill-compute-{i}"))
            .build()
            .map_err(|e| Error::param("threads", e.to_string()))?;
        // Loading (repacking weights) runs on the same threads as the forward passes.
        let Model {
            info,
            mut weights,
            tokenizer,
            template,
        } = pool.install(|| Model::load(&config.model, &device, Some(cap)))?;
        weights.set_kv_type(config.kv_cache)?;
        let context_length = weights.config().context_length;
        let draft = match &config.draft_model {
            Some(path) => Some(pool.install(|| {
                crate::draft::DraftModel::load(path, &device, &tokenizer, context_length)
            })?),
            None => None,
        };
        let (mut draft, draft_info) = draft.map_or((None, None), |(d, i)| (Some(d), Some(i)));
        let locked_weight_bytes = match config.lock_weights {
            true => pool.install(|| crate::model::lock_weights(&mut weights, draft.as_mut())),
            false => 0,
        };
        let tokenizer = Arc::new(tokenizer);
        let shared = Arc::new(Shared {
            info,
            grammars: Grammars::new(tokenizer.clone()),
            tokenizer,
            template,
            context_length,
            step_weight_bytes: weights.step_weight_bytes(),
            prompt_row_macs: weights.prompt_row_macs(),
            threads,
            next_id: AtomicU64::new(1),
            cache_bytes: AtomicUsize::new(0),
            prefix_bytes: AtomicUsize::new(0),
            live: Mutex::new(Vec::new()),
            device,
            panels_pending: std::sync::atomic::AtomicBool::new(
                weights.panels_pending() || draft.as_ref().is_some_and(|d| d.panels_pending()),
            ),
            draft: Mutex::new(draft_info),
            locked_weight_bytes,
        });
        let full_context = weights.kv_bytes(shared.context_length);
        let budget = config
            .kv_budget
            .unwrap_or_else(|| (available_memory() / 4).max(full_context));
        tracing::info!(budget_mb = budget / (1 << 20), "KV cache budget");
        let (tx, rx) = mpsc::channel();
        let mut worker = Worker::new(
            weights,
            shared.clone(),
            budget,
            config.prefill_chunk,
            pool,
            config.weigh_speculation,
        );
        worker.set_draft(draft);
        let thread = std::thread::Builder::new()
            .name("rill-inference".into())
            .spawn(move || worker::run_guarded(worker, rx))?;
        Ok(Engine {
            handle: Handle { tx, shared },
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.handle.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A cheap, cloneable way to talk to the engine from any thread or task.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Command>,
    pub(crate) shared: Arc<Shared>,
}

impl Handle {
    pub(crate) fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| Error::EngineStopped)
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.shared.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// Positions one sequence may hold.
    pub fn context_length(&self) -> usize {
        self.shared.context_length
    }

    /// Bytes of weights one decode step reads, as the engine holds them and as the file
    /// stores them (they differ where a format is repacked): with the machine's read
    /// bandwidth, the bound on decode speed.
    pub fn step_weight_bytes(&self) -> (usize, usize) {
        self.shared.step_weight_bytes
    }

    /// Multiply-adds a prompt row takes in the layers' matrices: with the machine's rate of
    /// byte products ([`crate::kernels::byte_product_peak`]), the bound on prefill speed.
    pub fn prompt_row_macs(&self) -> usize {
        self.shared.prompt_row_macs
    }

    /// Whether every weight matrix runs in its fastest layout: a model loads with some read
    /// in the file's map, and the engine makes their panels when idle or at the first long
    /// prompt (`kernels/later.rs`); prompts run at full speed from then on.
    pub fn weights_ready(&self) -> bool {
        !self.shared.panels_pending.load(Ordering::Relaxed)
    }

    /// Bytes of weights locked in memory ([`EngineConfig::lock_weights`]): 0 when not asked
    /// for, fewer than the weights when the system refused part of them.
    pub fn locked_weight_bytes(&self) -> usize {
        self.shared.locked_weight_bytes
    }

    /// Threads of the engine's compute pool.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Bytes of KV cache held by live sequences, as of the last round.
    pub fn cache_bytes(&self) -> usize {
        self.shared.cache_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of KV cache kept from finished answers for prefix reuse.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.shared.prefix_bytes.load(Ordering::Relaxed)
    }

    /// Ids of the generations the thread holds, as of the last round.
    pub fn live_ids(&self) -> Vec<u64> {
        self.activity().into_iter().map(|a| a.id).collect()
    }

    /// What every live generation is doing, as of the last round.
    pub fn activity(&self) -> Vec<Activity> {
        self.shared
            .live
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Checks that `grammar` can constrain an answer (a JSON schema llguidance accepts, a Lark
    /// grammar that parses), without starting anything. The first call builds the token trie.
    /// What it compiled is kept for the next answer with the same grammar, so a check before
    /// [`generate`](Self::generate) does not compile a large schema twice.
    pub fn check_grammar(&self, grammar: &Grammar) -> Result<()> {
        self.shared.grammars.check(grammar)
    }

    /// Starts a generation. Every check that depends on the request happens here.
    pub fn generate(&self, req: GenerateRequest) -> Result<Generation> {
        let sampler = Sampler::new(req.params.clone())?;
        if req.max_tokens == Some(0) {
            return Err(Error::param("max_tokens", "must be ≥ 1"));
        }
        if req.thinking_budget == Some(0) {
            return Err(Error::param("thinking_budget", "must be ≥ 1"));
        }
        if req.speculation == Speculation::Draft && self.draft_model().is_none() {
            return Err(Error::param(
                "speculation",
                "no draft model is loaded (start with --draft-model FILE, or choose one)",
            ));
        }
        let constraint = match &req.grammar {
            Some(g) => Some(self.shared.grammars.compile(g)?),
            None => None,
        };
        let (mut prompt, dropped_messages) =
            self.fit(&req.prompt, &req.chat, req.max_tokens, req.overflow)?;
        // gpt-oss's harmony messages are split by their channels; with tools offered, the
        // tool reader reads them instead (it knows the calls too).
        let harmony = self.tool_format() == ToolFormat::Harmony && req.chat.tools.is_empty();
        let split = match (req.split_reasoning, req.continues_reasoning) {
            (false, _) => None,
            (true, Some(inside)) if harmony => Some(ReasoningSplit::harmony_resumed(inside)),
            (true, Some(inside)) => Some(ReasoningSplit::resumed(inside)),
            // Under a grammar or a thinking budget the engine writes the analysis header
            // itself (what gpt-oss writes first): the budget then counts from the first
            // token, and the grammar waits for the final message.
            (true, None) if harmony => Some(
                match (req.grammar.is_some() || req.thinking_budget.is_some())
                    && self.open_analysis(&req, &mut prompt)
                {
                    true => ReasoningSplit::harmony_resumed(true),
                    false => ReasoningSplit::harmony(),
                },
            ),
            (true, None) => {
                let opened = self.opens_thinking(&prompt) || self.open_thinking(&req, &mut prompt);
                Some(ReasoningSplit::new(opened))
            }
        };
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = unbounded_channel();
        let prompt_tokens = prompt.len();
        // A new answer after a chat template drops the space a SentencePiece vocabulary puts
        // before its first word; raw text and tokens are continued as they are (issue 14).
        let mut decoder = match req.prompt {
            Prompt::Messages(_) => StreamDecoder::new(&self.shared.tokenizer),
            Prompt::Text(_) | Prompt::Tokens(_) => StreamDecoder::continuing(),
        };
        // The markers a reader parses are shown as text (control tokens are not, otherwise).
        if !req.chat.tools.is_empty() || (harmony && split.is_some()) {
            decoder.show(self.marker_ids(self.tool_format()));
        }
        let seq = Sequence::new(SequenceSpec {
            id,
            prompt,
            sampler,
            stops: StopStrings::new(req.stop),
            decoder,
            max_tokens: req.max_tokens,
            context_length: self.shared.context_length,
            ignore_eos: req.ignore_eos,
            priority: req.priority.clamp(1, MAX_PRIORITY),
            dropped_messages,
            top_candidates: req.top_candidates.min(MAX_CANDIDATES),
            constraint,
            split,
            thinking_budget: req.thinking_budget,
            speculation: req.speculation,
            events: events_tx,
            submitted: Instant::now(),
        });
        self.tx
            .send(Command::Add(Box::new(seq)))
            .map_err(|_| Error::EngineStopped)?;
        Ok(Generation {
            control: Control {
                id,
                tx: self.tx.clone(),
            },
            prompt_tokens,
            events,
        })
    }
}
