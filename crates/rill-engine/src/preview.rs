//! Next-token previews: the distribution an answer's first token would be drawn from under
//! given sampling settings, without generating (the panel's chart). The prompt goes through
//! the inference thread like any other; its logits are kept, so a slider moving asks again
//! without the model.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc::unbounded_channel;
use tokio::sync::oneshot;

use crate::engine::{ChatArgs, Command, Handle, Overflow, PreviewJob, Prompt, MAX_CANDIDATES};
use crate::error::{Error, Result};
use crate::sampler::{Distribution, Sampler, SamplingParams};
use crate::sequence::{Sequence, SequenceSpec, Speculation};
use crate::stop::StopStrings;
use crate::tokenizer::StreamDecoder;

/// Asks for the next-token distribution after a prompt, without generating.
#[derive(Clone, Debug)]
pub struct PreviewRequest {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// How many of the likeliest tokens to report (at most [`MAX_CANDIDATES`]).
    pub top: usize,
}

impl Handle {
    /// The distribution the first token of an answer to `prompt` is drawn from under
    /// `params`. The prompt goes through the model like any other (sharing the machine, reusing
    /// cached prefixes); its logits are then kept, so asking again for the same prompt with
    /// other parameters (a slider moving) is answered at once without the model.
    pub async fn preview(&self, req: PreviewRequest) -> Result<Distribution> {
        let sampler = Sampler::new(req.params)?;
        let (prompt, dropped_messages) = self.fit(
            &req.prompt,
            &ChatArgs::default(),
            None,
            Overflow::DropOldest,
        )?;
        let (events_tx, events) = unbounded_channel();
        let seq = Sequence::new(SequenceSpec {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            prompt,
            sampler,
            stops: StopStrings::new(Vec::new()),
            decoder: StreamDecoder::new(&self.shared.tokenizer),
            max_tokens: None,
            context_length: self.shared.context_length,
            ignore_eos: false,
            priority: 1,
            dropped_messages,
            top_candidates: req.top.clamp(1, MAX_CANDIDATES),
            constraint: None,
            split: None,
            thinking_budget: None,
            speculation: Speculation::Off,
            events: events_tx,
            submitted: Instant::now(),
        })
        .into_preview();
        let (reply, answer) = oneshot::channel();
        self.send(Command::Preview(Box::new(PreviewJob { seq, reply })))?;
        // The events receiver lives until the answer: dropping this future cancels the work.
        let result = answer.await.map_err(|_| Error::EngineStopped)?;
        drop(events);
        result
    }
}
