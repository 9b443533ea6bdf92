//! One generation as the inference thread holds it: its tokens, its own KV cache, its live
//! sampling parameters, its stop conditions, its timings, and the sender of its event channel.
//!
//! Everything is driven by one number, the tokens not yet in the cache ("pending"). A new
//! prompt has them all pending; a prefill step runs a chunk of them; a decode step runs the one
//! token drawn last. Whenever a step leaves nothing pending, the next token is drawn. The same
//! rule resumes a sequence whose cache was dropped to make room (it is simply prefilled again,
//! answer so far included) and one that reuses a cached prefix (fewer tokens are pending).
//! The [`SequenceState`] is derived from these fields, so it can never disagree with them.
//! A step that draws (a decode step, or the chunk that ends the prompt) can check a speculative
//! draft (`sequence/speculation.rs`): it runs the draft's rows too, and cuts the cache back to
//! the tokens drawn before the step ends.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::constraint::Constraint;
use crate::error::Result;
use crate::event::{Event, Timings, Usage};
use crate::model::KvCache;
use crate::reasoning::ReasoningSplit;
use crate::request::Speculation;
use crate::sampler::Sampler;
use crate::scheduler::{SeqView, SequenceState};
use crate::stop::{StopReason, StopStrings};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::vision::PromptImage;

mod emit;
mod speculation;
use speculation::Drafter;

/// Answer tokens between two `Stats` events.
const STATS_EVERY: usize = 16;

/// Tokens before a prompt's end where a recurrent model keeps its states: a next turn renders
/// the answer's header (`<|im_start|>assistant\n`, then the answer without its thinking
/// block) differently from the generation prompt, and parts from this prompt within its last
/// few tokens (llama.cpp's server keeps a checkpoint 4 tokens before the end).
const PROMPT_MARGIN: usize = 8;

pub(crate) struct Sequence {
    pub id: u64,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    cache: KvCache,
    sampler: Sampler,
    stops: StopStrings,
    decoder: StreamDecoder,
    max_tokens: Option<usize>,
    context_length: usize,
    ignore_eos: bool,
    pub priority: u8,
    pub paused: bool,
    /// False while it waits for KV-cache memory (new, or its cache was dropped).
    pub admitted: bool,
    started: bool,
    finished: Option<StopReason>,
    /// Tokens that are part of the answer (end-of-generation ids excluded).
    completion_tokens: usize,
    reused_tokens: usize,
    dropped_messages: usize,
    top_candidates: usize,
    /// The grammar the answer must match, if any.
    constraint: Option<Constraint>,
    /// Splits a thinking model's reasoning from its content, when the request asked.
    split: Option<ReasoningSplit>,
    /// Close the thinking block after this many tokens of it.
    thinking_budget: Option<usize>,
    /// Answer tokens drawn inside the thinking block.
    reasoning_tokens: usize,
    queue_position: Option<usize>,
    events: UnboundedSender<Event>,
    submitted: Instant,
    prefill_started: Option<Instant>,
    prefill_done: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// A preview: stop at the prompt's logits, keep them, draw nothing.
    preview: bool,
    preview_logits: Option<Vec<f32>>,
    /// Error text when it failed.
    failure: Option<String>,
    /// Its share of the rows of recent forward passes (moving average).
    pub share: f32,
    /// Proposes the next tokens to check in one pass, when the answer speculates.
    drafter: Option<Drafter>,
    /// This step's proposal, and the rows that check it (`speculation.rs`).
    draft: Vec<u32>,
    verify: Vec<u32>,
    /// The draft model's cache: `tokens` with `draft_skipped` of them left out after the
    /// prompt (`speculation.rs`), and, during a step, the proposal.
    draft_cache: KvCache,
    draft_skipped: usize,
    /// Rows its last decode step ran (1, or 1 + its draft).
    last_rows: usize,
    /// The prompt's images: where each one's rows go, and the rows.
    images: Vec<PromptImage>,
}

pub(crate) struct SequenceSpec {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub stops: StopStrings,
    pub decoder: StreamDecoder,
    pub max_tokens: Option<usize>,
    pub context_length: usize,
    pub ignore_eos: bool,
    pub priority: u8,
    pub dropped_messages: usize,
    /// Report this many likeliest candidates with every token (0: off).
    pub top_candidates: usize,
    pub constraint: Option<Constraint>,
    pub split: Option<ReasoningSplit>,
    pub thinking_budget: Option<usize>,
    pub speculation: Speculation,
    pub images: Vec<PromptImage>,
    pub events: UnboundedSender<Event>,
    pub submitted: Instant,
}

impl Sequence {
    pub fn new(s: SequenceSpec) -> Self {
        Sequence {
            id: s.id,
            prompt_len: s.prompt.len(),
            tokens: s.prompt,
            cache: KvCache::new(),
            sampler: s.sampler,
            stops: s.stops,
            decoder: s.decoder,
            max_tokens: s.max_tokens,
            context_length: s.context_length,
            ignore_eos: s.ignore_eos,
            priority: s.priority,
            paused: false,
            admitted: false,
            started: false,
            finished: None,
            completion_tokens: 0,
            reused_tokens: 0,
            dropped_messages: s.dropped_messages,
            top_candidates: s.top_candidates,
            constraint: s.constraint,
            split: s.split,
            thinking_budget: s.thinking_budget,
            reasoning_tokens: 0,
            queue_position: None,
            events: s.events,
            submitted: s.submitted,
            prefill_started: None,
            prefill_done: None,
            first_token: None,
            last_token: None,
            preview: false,
            preview_logits: None,
            failure: None,
            share: 0.0,
            drafter: Drafter::new(s.speculation),
            images: s.images,
            draft: Vec::new(),
            verify: Vec::new(),
            draft_cache: KvCache::new(),
            draft_skipped: 0,
            last_rows: 1,
        }
    }

    /// Makes this a preview: it runs its prompt and stops with the last position's logits.
    pub fn into_preview(mut self) -> Self {
        self.preview = true;
        self
    }

    pub fn is_preview(&self) -> bool {
        self.preview
    }

    /// The prompt's last logits, once a preview has them.
    pub fn take_preview_logits(&mut self) -> Option<Vec<f32>> {
        self.preview_logits.take()
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The next-token distribution for `logits` under this sequence's sampling parameters.
    pub fn distribution(&mut self, logits: &[f32]) -> Result<crate::sampler::Distribution> {
        self.sampler
            .distribution(logits, &self.tokens, self.top_candidates)
    }

    /// What it is doing, for the activity view.
    pub fn activity(&self) -> crate::event::Activity {
        crate::event::Activity {
            id: self.id,
            state: self.state(),
            priority: self.priority,
            prompt_tokens: self.prompt_len,
            prefilled: self.cache.len().min(self.prompt_len),
            completion_tokens: self.completion_tokens,
            share: self.share,
        }
    }

    /// Tokens not yet in the cache.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.cache.len()
    }

    pub fn state(&self) -> SequenceState {
        if self.finished.is_some() {
            SequenceState::Finished
        } else if self.paused {
            SequenceState::Paused
        } else if !self.admitted {
            SequenceState::Queued
        } else if self.pending() > 1 {
            SequenceState::Prefilling
        } else {
            SequenceState::Decoding
        }
    }

    pub fn view(&self) -> SeqView {
        SeqView {
            id: self.id,
            state: self.state(),
            priority: self.priority,
            prompt_left: self.pending(),
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Bytes of its caches: the model's, and the draft model's when it speculates with one.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes() + self.draft_cache.bytes()
    }

    /// Changes the answer-length cap while the answer runs; past it, the answer ends now.
    pub fn set_max_tokens(&mut self, max_tokens: Option<usize>) {
        self.max_tokens = max_tokens;
        if max_tokens.is_some_and(|m| self.completion_tokens >= m) {
            self.finish(StopReason::Length);
        }
    }

    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Sends an event; a closed channel means nobody listens any more: cancel.
    fn send(&mut self, ev: Event) {
        if self.events.send(ev).is_err() && self.finished.is_none() {
            self.finished = Some(StopReason::Cancelled);
        }
    }

    /// True when the receiver was dropped; the sequence is then cancelled without a word.
    pub fn receiver_gone(&self) -> bool {
        self.events.is_closed()
    }

    /// Tells the caller where it stands in the queue (only when that changes).
    pub fn queued_at(&mut self, position: usize) {
        if self.queue_position != Some(position) {
            self.queue_position = Some(position);
            self.send(Event::Queued { position });
        }
    }

    /// Lets the sequence run, starting from a cached prefix of its tokens when there is one.
    pub fn admit(&mut self, reused: Option<KvCache>) {
        if let Some(cache) = reused {
            debug_assert!(cache.len() < self.tokens.len());
            // Prompt reuse is counted once, at the first admission. An answer preempted and
            // admitted again can find a kept cache that covers its own answer so far (an
            // identical greedy answer finished meanwhile): that is not prompt reuse (issue 13).
            let mut cache = cache;
            // A kept prefix that ends inside an image stops before it (its rows go in whole).
            if let Some(im) = self
                .images
                .iter()
                .find(|im| im.at < cache.len() && cache.len() < im.at + im.rows.rows)
            {
                cache.truncate(im.at);
            }
            if !self.started {
                self.reused_tokens = cache.len().min(self.prompt_len);
            }
            self.cache = cache;
        }
        self.admitted = true;
        self.queue_position = None;
        if !self.started {
            self.started = true;
            self.send(Event::Started {
                prompt_tokens: self.prompt_len,
                reused_tokens: self.reused_tokens,
                dropped_messages: self.dropped_messages,
            });
        }
    }

    /// Frees the cache to make room; the sequence waits for memory and is then recomputed.
    pub fn evict(&mut self) {
        self.cache = KvCache::new();
        self.admitted = false;
        self.reset_draft();
    }

    /// Hands the cache over (with the tokens it holds) for prefix reuse, once finished.
    pub fn take_cache(&mut self) -> (Vec<u32>, KvCache) {
        let cache = std::mem::take(&mut self.cache);
        (self.tokens[..cache.len()].to_vec(), cache)
    }

    /// How many of the next `n` pending tokens a prefill step takes so that no image is
    /// split between steps (its rows may attend to each other both ways): `n`, or fewer to
    /// stop before an image, or more to take the whole image it starts with.
    pub fn whole_images(&self, n: usize) -> usize {
        let from = self.cache.len();
        let rows = |im: &PromptImage| (im.at, im.at + im.rows.rows);
        match self
            .images
            .iter()
            .map(rows)
            .find(|&(a, b)| a < from + n && from + n < b)
        {
            Some((a, _)) if a > from => a - from,
            Some((_, b)) => b - from,
            None => n,
        }
    }

    /// The images among the next `n` tokens, each `at` its first row's place in the step.
    pub fn step_images(&self, n: usize) -> Vec<PromptImage> {
        let from = self.cache.len();
        self.images
            .iter()
            .filter(|im| im.at >= from && im.at < from + n)
            .map(|im| PromptImage {
                at: im.at - from,
                ..im.clone()
            })
            .collect()
    }

    /// The next `n` pending tokens and the cache they go into, for a batched step (with a
    /// draft: the pending tokens and the draft).
    pub fn step_input(&mut self, n: usize) -> (&[u32], &mut KvCache) {
        let from = self.cache.len();
        // Where a recurrent model's states are kept inside the prompt (`model/recurrent.rs`):
        // before its last token, and a few tokens before its end.
        let end = self.prompt_len;
        self.cache
            .keep_states_at(&[end.saturating_sub(1), end.saturating_sub(PROMPT_MARGIN)]);
        self.prefill_started.get_or_insert_with(Instant::now);
        if !self.draft.is_empty() {
            self.verify_input();
            return (&self.verify, &mut self.cache);
        }
        (&self.tokens[from..from + n], &mut self.cache)
    }

    /// After a step: when nothing is pending any more, draw the next token (or check the
    /// draft, token by token).
    pub fn after_step(&mut self, tok: &Tokenizer, logits: Vec<f32>) -> Result<()> {
        if self.first_token.is_some() {
            self.last_rows = self.logit_rows();
        }
        self.draw_after_step(tok, logits)
    }

    fn draw_after_step(&mut self, tok: &Tokenizer, mut logits: Vec<f32>) -> Result<()> {
        if !self.draft.is_empty() {
            // (The check cuts the cache back first, so a prompt's checkpoint below holds
            // no draft token.)
            let checked = self.check_draft(tok, logits);
            self.prompt_in();
            return checked;
        }
        self.prompt_in();
        if self.pending() == 0 {
            if self.preview {
                self.preview_logits = Some(logits);
                self.finish(StopReason::Stop);
                return Ok(());
            }
            self.sample_and_emit(tok, &mut logits, None)?;
        }
        Ok(())
    }

    /// Once the prompt is in the cache: its time, and a checkpoint.
    fn prompt_in(&mut self) {
        if self.prefill_done.is_none() && self.cache.len() >= self.prompt_len {
            self.prefill_done = Some(Instant::now());
            // Windowed layers drop what their window leaves behind; this keeps the prompt's
            // end reachable for the next turn or a regenerated answer (`kv.rs`).
            self.cache.checkpoint();
        }
    }

    fn timings(&self) -> Timings {
        let ms = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64() * 1000.0,
            _ => 0.0,
        };
        let prefill_ms = ms(self.prefill_started, self.prefill_done);
        let decode_ms = ms(self.first_token, self.last_token);
        let prefilled = self.prompt_len.saturating_sub(self.reused_tokens);
        Timings {
            ttft_ms: ms(Some(self.submitted), self.first_token),
            prefill_tps: if prefill_ms > 0.0 {
                prefilled as f64 * 1000.0 / prefill_ms
            } else {
                0.0
            },
            // Tokens after the first, over the time between the first and the last.
            decode_tps: if decode_ms > 0.0 {
                (self.tokens.len() - self.prompt_len - 1) as f64 * 1000.0 / decode_ms
            } else {
                0.0
            },
        }
    }

    /// Ends the sequence (once) and sends `Done` with usage and timings. A stopped answer
    /// (Stop, shutdown) first gets the text still held back, as one last `Token` repeating the
    /// last token's id: the start of a possible stop string, or bytes of an unfinished
    /// character. That text was produced, so it is part of the answer (issue 13).
    pub fn finish(&mut self, reason: StopReason) {
        if self.finished.is_some() {
            return;
        }
        if reason == StopReason::Cancelled && !self.preview {
            let last = self.tokens[self.prompt_len..].last().copied();
            if let Some(ev) = last.and_then(|id| self.held_event(id, Vec::new())) {
                let _ = self.events.send(ev);
            }
        }
        self.finished = Some(reason);
        let (draft_proposed, draft_accepted) = self.draft_counts();
        let usage = Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.completion_tokens,
            reasoning_tokens: self.reasoning_tokens,
            draft_proposed,
            draft_accepted,
        };
        let _ = self.events.send(Event::Done {
            reason,
            usage,
            timings: self.timings(),
        });
    }

    pub fn finish_reason(&self) -> Option<StopReason> {
        self.finished
    }

    /// Reports an error and ends the sequence.
    pub fn fail(&mut self, message: String) {
        self.failure = Some(message.clone());
        let _ = self.events.send(Event::Error { message });
        self.finished = Some(StopReason::Cancelled);
    }
}
