//! A generation as its caller holds it: the [`Generation`] (its events, in order, and dropping
//! it cancels), the [`Control`] that steers it from any thread (pause, resume, cancel, priority,
//! live sampling settings, the answer-length cap), and [`Collected`], a whole answer drained at
//! once. Every control is a message to the inference thread (`command.rs`).

use std::sync::mpsc;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::command::Command;
use crate::error::{Error, Result};
use crate::event::{Event, Timings, Usage};
use crate::request::MAX_PRIORITY;
use crate::sampler::SamplingParams;
use crate::stop::StopReason;

/// Steers a running generation; cheap to clone, usable from any thread.
#[derive(Clone, Debug)]
pub struct Control {
    pub(crate) id: u64,
    pub(crate) tx: mpsc::Sender<Command>,
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

    /// Decode steps per round relative to others (1 = equal share), clamped to
    /// 1..=[`MAX_PRIORITY`].
    pub fn set_priority(&self, priority: u8) -> Result<()> {
        self.send(Command::SetPriority(
            self.id,
            priority.clamp(1, MAX_PRIORITY),
        ))
    }

    /// A new cap on answer tokens (`None`: until the model stops or the context is full). An
    /// answer already past it ends now with `StopReason::Length`.
    pub fn set_max_tokens(&self, max_tokens: Option<usize>) -> Result<()> {
        if max_tokens == Some(0) {
            return Err(Error::param("max_tokens", "must be ≥ 1"));
        }
        self.send(Command::SetMaxTokens(self.id, max_tokens))
    }
}

/// A running generation: its events, and its controls. Dropping it cancels the generation.
pub struct Generation {
    pub(crate) control: Control,
    pub(crate) prompt_tokens: usize,
    pub(crate) events: UnboundedReceiver<Event>,
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
                Event::Token { id, text, .. } => {
                    out.ids.push(id);
                    out.text.push_str(&text);
                }
                Event::Done {
                    reason,
                    usage,
                    timings,
                } => {
                    // A stopped answer's held-back text comes as a last token repeating the
                    // last id: the ids are the answer's tokens.
                    out.ids.truncate(usage.completion_tokens);
                    out.reason = Some(reason);
                    out.usage = usage;
                    out.timings = timings;
                    return Ok(out);
                }
                Event::Error { message } => {
                    return Err(Error::Candle(candle_core::Error::Msg(message)))
                }
                Event::Queued { .. } | Event::Started { .. } | Event::Stats { .. } => {}
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
