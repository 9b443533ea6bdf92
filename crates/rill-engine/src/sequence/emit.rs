//! How a sequence turns a step's logits into its answer: the next token drawn (under the
//! grammar, once the thinking block allows it) and sent as text through the streaming
//! decoder, the stop strings and the reasoning split; a thinking budget's closing tokens
//! forced in; the text held back released when the answer ends.

use std::time::Instant;

use super::{Sequence, STATS_EVERY};
use crate::error::Result;
use crate::event::Event;
use crate::reasoning::ReasoningSplit;
use crate::stop::{StopCheck, StopReason};
use crate::tokenizer::Tokenizer;

impl Sequence {
    /// True while the answer is inside its thinking block (when the request split it).
    pub(super) fn thinking(&self) -> bool {
        self.split
            .as_ref()
            .is_some_and(ReasoningSplit::in_reasoning)
    }

    /// True while a grammar waits: before the answer proper (the thinking block, harmony's
    /// analysis and headers).
    pub(super) fn grammar_waits(&self) -> bool {
        self.split
            .as_ref()
            .is_some_and(ReasoningSplit::before_answer)
    }

    /// Draws the next token and sends it; `guess`: a draft's token for this position, so the
    /// event can say whether the model drew it.
    pub(super) fn sample_and_emit(
        &mut self,
        tok: &Tokenizer,
        logits: &mut [f32],
        guess: Option<u32>,
    ) -> Result<()> {
        // A grammar shapes the answer, not the thinking before it: it waits (its first mask
        // kept) until the block closes.
        let (thinking, waits) = (self.thinking(), self.grammar_waits());
        if let Some(c) = self.constraint.as_mut().filter(|_| !waits) {
            // Room left: the length limit's, and the context's (one position per token).
            let room = self.context_length.saturating_sub(self.tokens.len());
            let left = self
                .max_tokens
                .map_or(room, |m| m.saturating_sub(self.completion_tokens).min(room));
            c.apply(logits, left)?;
        }
        let (id, candidates) = if self.top_candidates > 0 {
            self.sampler
                .sample_explained(logits, &self.tokens, self.top_candidates)?
        } else {
            (self.sampler.sample(logits, &self.tokens)?, Vec::new())
        };
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.tokens.push(id);
        let drafted = guess == Some(id);

        if !self.ignore_eos && tok.is_eog(id) {
            // The end token itself is not part of the answer; text held back for a possible stop
            // string is released with it.
            if let Some(ev) = self.held_event(id, candidates) {
                self.send(ev);
            }
            self.finish(StopReason::Stop);
            return Ok(());
        }
        self.completion_tokens += 1;
        self.reasoning_tokens += usize::from(thinking);
        // A complete grammar allows nothing but the end: the answer ends here, without
        // another forward pass to draw that end.
        let grammar_done = match self.constraint.as_mut().filter(|_| !waits) {
            Some(c) => c.commit(id)?,
            None => false,
        };
        let (mut text, matched) = self.text_of(tok, id);
        let length_reached = self.max_tokens.is_some_and(|m| self.completion_tokens >= m);
        // The cache holds `context_length` positions; the token just drawn needs one more.
        let context_full = self.tokens.len() >= self.context_length;
        let reason = if matched {
            Some(StopReason::StopString)
        } else if grammar_done {
            Some(StopReason::Stop)
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
        let (text, reasoning) = self.split_text(text, reason.is_some());
        self.send(Event::Token {
            id,
            text,
            reasoning,
            candidates,
            drafted,
        });
        // (A grammar waits for the block's end, so the closing tokens are not its to take.)
        let over_budget = self
            .thinking_budget
            .is_some_and(|b| thinking && self.reasoning_tokens >= b);
        if let Some(r) = reason {
            self.finish(r);
        } else if over_budget {
            self.close_thinking(tok);
        } else if self.completion_tokens.is_multiple_of(STATS_EVERY) {
            let timings = self.timings();
            self.send(Event::Stats {
                completion_tokens: self.completion_tokens,
                tokens_per_second: timings.decode_tps,
                reused_tokens: self.reused_tokens,
            });
        }
        Ok(())
    }

    /// Ends the thinking block the budget allows no more of: its closing tokens join the
    /// answer as if drawn (sent as tokens, counted, run through the model with the next step),
    /// and the model goes on with its answer after them.
    pub(super) fn close_thinking(&mut self, tok: &Tokenizer) {
        let Some(closing) = self.split.as_ref().map(ReasoningSplit::closing) else {
            return;
        };
        let Ok(ids) = tok.encode_with(closing, false) else {
            return;
        };
        if self.tokens.len() + ids.len() >= self.context_length {
            // No room for the block's end and an answer after it.
            self.finish(StopReason::ContextFull);
            return;
        }
        let Some(&last) = ids.last() else {
            return;
        };
        for id in ids {
            self.tokens.push(id);
            self.completion_tokens += 1;
            let (text, matched) = self.text_of(tok, id);
            let (text, reasoning) = self.split_text(text, matched);
            self.send(Event::Token {
                id,
                text,
                reasoning,
                candidates: Vec::new(),
                drafted: false,
            });
            if matched {
                self.finish(StopReason::StopString);
                return;
            }
        }
        if self.max_tokens.is_some_and(|m| self.completion_tokens >= m) {
            if let Some(ev) = self.held_event(last, Vec::new()) {
                self.send(ev);
            }
            self.finish(StopReason::Length);
        }
    }

    /// A drawn (or forced) token's text through the decoder and the stop strings: what it
    /// releases, and whether a stop string ends there.
    pub(super) fn text_of(&mut self, tok: &Tokenizer, id: u32) -> (String, bool) {
        let piece = self.decoder.push(tok, id);
        match self.stops.push(&piece) {
            StopCheck::Continue(t) => (t, false),
            StopCheck::Matched(t) => (t, true),
        }
    }

    /// The text still held back (a possible stop string's start, an unfinished character, a
    /// possible think marker) as a last `Token` repeating `id`; `None` when nothing was held.
    pub(super) fn held_event(
        &mut self,
        id: u32,
        candidates: Vec<crate::sampler::Candidate>,
    ) -> Option<Event> {
        let held = self.stops.flush() + &self.decoder.flush();
        let (text, reasoning) = self.split_text(held, true);
        (!text.is_empty() || !reasoning.is_empty()).then_some(Event::Token {
            id,
            text,
            reasoning,
            candidates,
            drafted: false,
        })
    }

    /// A token's `text` as (content, reasoning), split when the request asked (`last`: the
    /// answer ends here, so nothing stays held back).
    pub(super) fn split_text(&mut self, text: String, last: bool) -> (String, String) {
        let Some(split) = &mut self.split else {
            return (text, String::new());
        };
        let mut parts = split.push(&text);
        if last {
            parts.append(split.flush());
        }
        (parts.content, parts.reasoning)
    }
}
