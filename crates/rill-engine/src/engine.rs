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

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::Device;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::{Error, Result};
use crate::model::{Model, ModelInfo};
use crate::sampler::{Sampler, SamplingParams};
use crate::scheduler::{plan_round, SequenceState, Work};
use crate::sequence::{Sequence, SequenceSpec};
use crate::stop::{StopReason, StopStrings};
use crate::template::{ChatTemplate, Message};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    /// Needs the `cuda` cargo feature.
    Cuda,
    /// Needs the `metal` cargo feature.
    Metal,
}

impl DeviceKind {
    fn device(self) -> Result<Device> {
        Ok(match self {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Cuda => Device::new_cuda(0)?,
            DeviceKind::Metal => Device::new_metal(0)?,
        })
    }
}

/// How to start an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub device: DeviceKind,
    /// Compute threads; `None` = one per physical core. Applies process-wide (candle keeps one
    /// pool), so the first engine of a process decides.
    pub threads: Option<usize>,
    /// Cap on the context window (positions per sequence); `None` = the model's, at most 8192.
    pub context_size: Option<usize>,
    /// Prompt tokens per prefill step, so a long prompt never freezes other answers.
    pub prefill_chunk: usize,
}

impl EngineConfig {
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineConfig { model: model.into(), device: DeviceKind::Cpu, threads: None, context_size: None, prefill_chunk: 256 }
    }
}

/// Default context cap: enough for long chats, small enough that a 128k-context model does not
/// reserve gigabytes of RoPE tables and cache by default.
const DEFAULT_CONTEXT_CAP: usize = 8192;

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
    /// Decode steps per round relative to others (1 = equal share).
    pub priority: u8,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest { prompt, params: SamplingParams::default(), stop: Vec::new(), max_tokens: None, priority: 1, ignore_eos: false }
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

/// What a generation reports, in order: `Started`, `Token`…, then `Done` or `Error`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Admitted: its prompt goes through the model now.
    Started { prompt_tokens: usize, reused_tokens: usize },
    /// One answer token and the text it completes (possibly empty: half a character, or text
    /// held back because it may begin a stop string).
    Token { id: u32, text: String },
    /// The end, with why, how many tokens and how fast.
    Done { reason: StopReason, usage: Usage, timings: Timings },
    /// The generation failed; nothing follows.
    Error { message: String },
}

enum Command {
    Add(Box<Sequence>),
    SetParams(u64, SamplingParams),
    Pause(u64),
    Resume(u64),
    Cancel(u64),
    SetPriority(u64, u8),
    Shutdown,
}

/// What every handle shares: the model's text side and counters the thread keeps up to date.
struct Shared {
    info: ModelInfo,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    context_length: usize,
    next_id: AtomicU64,
    cache_bytes: AtomicUsize,
    /// Ids of the sequences the thread holds, as of the last round.
    live: Mutex<Vec<u64>>,
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
        if let Some(n) = config.threads {
            if n == 0 {
                return Err(Error::param("threads", "must be ≥ 1"));
            }
            // candle sizes its CPU pools from these on first use.
            std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
            std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        } else if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            // Physical cores: hyper-threads share the SIMD units the matmuls saturate.
            std::env::set_var("CANDLE_NUM_THREADS", num_cpus::get_physical().max(1).to_string());
        }
        let device = config.device.device()?;
        let cap = config.context_size.unwrap_or(DEFAULT_CONTEXT_CAP);
        if cap == 0 {
            return Err(Error::param("context_size", "must be ≥ 1"));
        }
        let Model { info, weights, tokenizer, template } = Model::load(&config.model, &device, Some(cap))?;
        let shared = Arc::new(Shared {
            info,
            tokenizer,
            template,
            context_length: weights.config().context_length,
            next_id: AtomicU64::new(1),
            cache_bytes: AtomicUsize::new(0),
            live: Mutex::new(Vec::new()),
        });
        let (tx, rx) = mpsc::channel();
        let thread_shared = shared.clone();
        let chunk = config.prefill_chunk;
        let thread = std::thread::Builder::new()
            .name("rill-inference".into())
            .spawn(move || run(weights, thread_shared, rx, chunk))?;
        Ok(Engine { handle: Handle { tx, shared }, thread: Some(thread) })
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
    shared: Arc<Shared>,
}

impl Handle {
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

    /// Bytes of KV cache held by live sequences, as of the last round.
    pub fn cache_bytes(&self) -> usize {
        self.shared.cache_bytes.load(Ordering::Relaxed)
    }

    /// Ids of the generations the thread holds, as of the last round.
    pub fn live_ids(&self) -> Vec<u64> {
        self.shared.live.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Renders a conversation with the model's chat template, ready for the answer.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.shared.template.render(messages, true)
    }

    /// The prompt's token ids, as the engine will run them.
    pub fn tokenize_prompt(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let empty = || Error::param("prompt", "is empty");
        let ids = match prompt {
            Prompt::Messages(m) => {
                if m.iter().all(|m| m.content.trim().is_empty()) {
                    return Err(empty());
                }
                self.shared.tokenizer.encode(&self.render(m)?)?
            }
            Prompt::Text(t) if t.is_empty() => return Err(empty()),
            Prompt::Text(t) => self.shared.tokenizer.encode(t)?,
            Prompt::Tokens(ids) => {
                let vocab = self.shared.tokenizer.vocab_size() as u32;
                if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                    return Err(Error::param("prompt", format!("token id {bad} is outside the vocabulary (size {vocab})")));
                }
                ids.clone()
            }
        };
        if ids.is_empty() {
            return Err(empty());
        }
        Ok(ids)
    }

    /// Starts a generation. Every check that depends on the request happens here.
    pub fn generate(&self, req: GenerateRequest) -> Result<Generation> {
        let sampler = Sampler::new(req.params)?;
        if req.max_tokens == Some(0) {
            return Err(Error::param("max_tokens", "must be ≥ 1"));
        }
        let prompt = self.tokenize_prompt(&req.prompt)?;
        let context = self.shared.context_length;
        if prompt.len() >= context {
            return Err(Error::PromptTooLong { prompt_tokens: prompt.len(), context });
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = unbounded_channel();
        let prompt_tokens = prompt.len();
        let seq = Sequence::new(SequenceSpec {
            id,
            prompt,
            sampler,
            stops: StopStrings::new(req.stop),
            decoder: StreamDecoder::new(&self.shared.tokenizer),
            max_tokens: req.max_tokens,
            context_length: context,
            ignore_eos: req.ignore_eos,
            priority: req.priority.max(1),
            events: events_tx,
            submitted: Instant::now(),
        });
        self.tx.send(Command::Add(Box::new(seq))).map_err(|_| Error::EngineStopped)?;
        Ok(Generation { control: Control { id, tx: self.tx.clone() }, prompt_tokens, events })
    }
}

/// Steers a running generation; cheap to clone, usable from any thread.
#[derive(Clone, Debug)]
pub struct Control {
    id: u64,
    tx: mpsc::Sender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

impl Control {
    pub fn id(&self) -> u64 {
        self.id
    }

    fn send(&self, c: Command) -> Result<()> {
        self.tx.send(c).map_err(|_| Error::EngineStopped)
    }

    /// New sampling parameters, used from the next token on.
    pub fn set_params(&self, params: SamplingParams) -> Result<()> {
        params.validate()?;
        self.send(Command::SetParams(self.id, params))
    }

    /// Parks the generation with its cache.
    pub fn pause(&self) -> Result<()> {
        self.send(Command::Pause(self.id))
    }

    /// Continues a paused generation exactly where it was.
    pub fn resume(&self) -> Result<()> {
        self.send(Command::Resume(self.id))
    }

    /// Stops it; `Done { reason: Cancelled }` follows with what was produced so far.
    pub fn cancel(&self) -> Result<()> {
        self.send(Command::Cancel(self.id))
    }

    /// Decode steps per round relative to others (1 = equal share).
    pub fn set_priority(&self, priority: u8) -> Result<()> {
        self.send(Command::SetPriority(self.id, priority.max(1)))
    }
}

/// A running generation: its events, and its controls. Dropping it cancels the generation.
pub struct Generation {
    control: Control,
    prompt_tokens: usize,
    events: UnboundedReceiver<Event>,
}

impl Generation {
    pub fn control(&self) -> &Control {
        &self.control
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The next event, waiting for it (async).
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// The next event, blocking the thread (not for use inside an async runtime).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.events.blocking_recv()
    }

    pub fn set_params(&self, params: SamplingParams) -> Result<()> {
        self.control.set_params(params)
    }
    pub fn pause(&self) -> Result<()> {
        self.control.pause()
    }
    pub fn resume(&self) -> Result<()> {
        self.control.resume()
    }
    pub fn cancel(&self) -> Result<()> {
        self.control.cancel()
    }
    pub fn set_priority(&self, priority: u8) -> Result<()> {
        self.control.set_priority(priority)
    }

    /// Drains the generation: the answer's text, its token ids, and the final event.
    pub fn collect_blocking(mut self) -> Result<Collected> {
        let mut out = Collected::default();
        while let Some(ev) = self.blocking_next() {
            match ev {
                Event::Token { id, text } => {
                    out.ids.push(id);
                    out.text.push_str(&text);
                }
                Event::Done { reason, usage, timings } => {
                    out.reason = Some(reason);
                    out.usage = usage;
                    out.timings = timings;
                    return Ok(out);
                }
                Event::Error { message } => return Err(Error::Candle(candle_core::Error::Msg(message))),
                Event::Started { .. } => {}
            }
        }
        Err(Error::EngineStopped)
    }
}

/// A whole answer, from [`Generation::collect_blocking`].
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub text: String,
    pub ids: Vec<u32>,
    pub reason: Option<StopReason>,
    pub usage: Usage,
    pub timings: Timings,
}

impl Iterator for Generation {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.blocking_next()
    }
}

/// The inference thread: apply commands, plan a round, execute it, drop what finished.
fn run(model: crate::model::Llama, shared: Arc<Shared>, rx: mpsc::Receiver<Command>, prefill_chunk: usize) {
    let mut seqs: Vec<Sequence> = Vec::new();
    loop {
        // Block only when there is nothing to compute.
        let idle = !seqs.iter().any(|s| matches!(s.state(), SequenceState::Prefilling | SequenceState::Decoding));
        if idle {
            match rx.recv() {
                Ok(cmd) => {
                    if !apply(cmd, &mut seqs) {
                        return;
                    }
                }
                Err(_) => return, // every handle is gone
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if !apply(cmd, &mut seqs) {
                        return;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if seqs.is_empty() {
                        return;
                    }
                    break;
                }
            }
        }
        for s in seqs.iter_mut().filter(|s| s.state() != SequenceState::Finished && s.receiver_gone()) {
            s.finish(StopReason::Cancelled);
        }

        let views: Vec<_> = seqs.iter().map(Sequence::view).collect();
        for work in plan_round(&views, prefill_chunk) {
            let (id, result) = match work {
                Work::Prefill { id, tokens } => {
                    let Some(s) = seqs.iter_mut().find(|s| s.id == id) else { continue };
                    (id, s.prefill(&model, &shared.tokenizer, tokens))
                }
                Work::Decode { id, steps } => {
                    let Some(s) = seqs.iter_mut().find(|s| s.id == id) else { continue };
                    let mut r = Ok(());
                    for _ in 0..steps {
                        if s.state() != SequenceState::Decoding {
                            break;
                        }
                        r = s.decode(&model, &shared.tokenizer);
                        if r.is_err() {
                            break;
                        }
                    }
                    (id, r)
                }
            };
            if let Err(e) = result {
                tracing::error!(seq = id, error = %e, "generation failed");
                if let Some(s) = seqs.iter_mut().find(|s| s.id == id) {
                    s.fail(e.to_string());
                }
            }
        }

        // Finished sequences leave now, and their caches with them.
        seqs.retain(|s| s.state() != SequenceState::Finished);
        shared.cache_bytes.store(seqs.iter().map(Sequence::cache_bytes).sum(), Ordering::Relaxed);
        if let Ok(mut live) = shared.live.lock() {
            live.clear();
            live.extend(seqs.iter().map(|s| s.id));
        }
    }
}

/// Applies one command; false means shut down.
fn apply(cmd: Command, seqs: &mut Vec<Sequence>) -> bool {
    fn find(seqs: &mut [Sequence], id: u64) -> Option<&mut Sequence> {
        seqs.iter_mut().find(|s| s.id == id)
    }
    match cmd {
        Command::Add(seq) => {
            let mut seq = *seq;
            seq.started();
            seqs.push(seq);
        }
        Command::SetParams(id, p) => {
            if let Some(s) = find(seqs, id) {
                // Validated by Control::set_params; a failure here would be a bug, not user input.
                if let Err(e) = s.sampler_mut().set_params(p) {
                    tracing::warn!(seq = id, error = %e, "rejected sampling change");
                }
            }
        }
        Command::Pause(id) => {
            if let Some(s) = find(seqs, id) {
                s.paused = true;
            }
        }
        Command::Resume(id) => {
            if let Some(s) = find(seqs, id) {
                s.paused = false;
            }
        }
        Command::Cancel(id) => {
            if let Some(s) = find(seqs, id) {
                if s.state() != SequenceState::Finished {
                    s.finish(StopReason::Cancelled);
                }
            }
        }
        Command::SetPriority(id, p) => {
            if let Some(s) = find(seqs, id) {
                s.priority = p;
            }
        }
        Command::Shutdown => {
            for s in seqs.iter_mut() {
                s.finish(StopReason::Cancelled);
            }
            return false;
        }
    }
    true
}
