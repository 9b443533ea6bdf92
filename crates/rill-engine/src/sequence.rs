//! One generation as the inference thread holds it: its tokens, its own KV cache, its live
//! sampling parameters, its stop conditions, its timings, and the sender of its event channel.
//!
//! A sequence moves through [`SequenceState`]s: prefilling (prompt chunks into the cache),
//! decoding (one token per step), paused, finished. The state is derived from the fields that
//! matter (prompt left, paused flag, finish reason), so it can never disagree with them.

use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{Event, Timings, Usage};
use crate::error::Result;
use crate::model::{KvCache, Llama};
use crate::sampler::Sampler;
use crate::scheduler::{SeqView, SequenceState};
use crate::stop::{StopCheck, StopReason, StopStrings};
use crate::tokenizer::{StreamDecoder, Tokenizer};

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
    finished: Option<StopReason>,
    /// Tokens that are part of the answer (end-of-generation ids excluded).
    completion_tokens: usize,
    events: UnboundedSender<Event>,
    submitted: Instant,
    prefill_started: Option<Instant>,
    prefill_done: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
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
            finished: None,
            completion_tokens: 0,
            events: s.events,
            submitted: s.submitted,
            prefill_started: None,
            prefill_done: None,
            first_token: None,
            last_token: None,
        }
    }

    pub fn state(&self) -> SequenceState {
        if self.finished.is_some() {
            SequenceState::Finished
        } else if self.paused {
            SequenceState::Paused
        } else if self.cache.len() < self.prompt_len {
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
            prompt_left: self.prompt_len.saturating_sub(self.cache.len()),
        }
    }

    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
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

    pub fn started(&mut self) {
        self.send(Event::Started { prompt_tokens: self.prompt_len, reused_tokens: 0 });
    }

    /// Runs the next `n` prompt tokens; after the last chunk, the first answer token is drawn.
    pub fn prefill(&mut self, model: &Llama, tok: &Tokenizer, n: usize) -> Result<()> {
        self.prefill_started.get_or_insert_with(Instant::now);
        let from = self.cache.len();
        let mut logits = model.forward(&self.tokens[from..from + n], &mut self.cache)?;
        if self.cache.len() == self.prompt_len {
            self.prefill_done = Some(Instant::now());
            self.sample_and_emit(tok, &mut logits)?;
        }
        Ok(())
    }

    /// Runs the last drawn token through the model and draws the next one.
    pub fn decode(&mut self, model: &Llama, tok: &Tokenizer) -> Result<()> {
        let last = self.tokens.len() - 1;
        debug_assert_eq!(self.cache.len(), last, "decode runs the one token not yet cached");
        let mut logits = model.forward(&self.tokens[last..], &mut self.cache)?;
        self.sample_and_emit(tok, &mut logits)
    }

    fn sample_and_emit(&mut self, tok: &Tokenizer, logits: &mut [f32]) -> Result<()> {
        let id = self.sampler.sample(logits, &self.tokens)?;
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.tokens.push(id);

        if !self.ignore_eos && tok.is_eog(id) {
            // The end token itself is not part of the answer; text held back for a possible stop
            // string is released with it.
            let held = self.stops.flush() + &self.decoder.flush();
            if !held.is_empty() {
                self.send(Event::Token { id, text: held });
            }
            return Ok(self.finish(StopReason::Stop));
        }
        self.completion_tokens += 1;
        let piece = self.decoder.push(tok, id);
        let (mut text, matched) = match self.stops.push(&piece) {
            StopCheck::Continue(t) => (t, false),
            StopCheck::Matched(t) => (t, true),
        };
        let length_reached = self.max_tokens.is_some_and(|m| self.completion_tokens >= m);
        // The cache holds `context_length` positions; the token just drawn needs one more.
        let context_full = self.tokens.len() >= self.context_length;
        let reason = if matched {
            Some(StopReason::StopString)
        } else if length_reached {
            Some(StopReason::Length)
        } else if context_full {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        if reason.is_some() && !matched {
            text.push_str(&self.stops.flush());
            text.push_str(&self.decoder.flush());
        }
        self.send(Event::Token { id, text });
        if let Some(r) = reason {
            self.finish(r);
        }
        Ok(())
    }

    /// Ends the sequence (once) and sends `Done` with usage and timings.
    pub fn finish(&mut self, reason: StopReason) {
        if matches!(self.finished, Some(StopReason::Cancelled)) && reason != StopReason::Cancelled {
            return; // the listener is gone; nothing to report
        }
        self.finished = Some(reason);
        let ms = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64() * 1000.0,
            _ => 0.0,
        };
        let prefill_ms = ms(self.prefill_started, self.prefill_done);
        let decode_ms = ms(self.first_token, self.last_token);
        let timings = Timings {
            ttft_ms: ms(Some(self.submitted), self.first_token),
            prefill_tps: if prefill_ms > 0.0 { self.prompt_len as f64 * 1000.0 / prefill_ms } else { 0.0 },
            // Tokens after the first, over the time between the first and the last.
            decode_tps: if decode_ms > 0.0 { (self.tokens.len() - self.prompt_len - 1) as f64 * 1000.0 / decode_ms } else { 0.0 },
        };
        let usage = Usage { prompt_tokens: self.prompt_len, completion_tokens: self.completion_tokens };
        let _ = self.events.send(Event::Done { reason, usage, timings });
    }

    /// Reports an error and ends the sequence.
    pub fn fail(&mut self, message: String) {
        let _ = self.events.send(Event::Error { message });
        self.finished = Some(StopReason::Cancelled);
    }
}
