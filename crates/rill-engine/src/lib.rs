//! # rill-engine
//!
//! Everything between "messages + sampling settings" and "a stream of tokens".
//!
//! ```text
//! Handle::generate(GenerateRequest)          caller's thread (handle.rs): validate, template,
//!        │ Command::Add(Sequence)            tokenize (prompting.rs); command.rs
//!        ▼
//! inference thread (worker.rs)               owns the weights (model/) once
//!   loop { plan_round(views) → Work }        scheduler.rs: a decode step for every running
//!        │                                   sequence, and the prompt tokens that fit, per round
//!        ▼                                   each sequence (sequence.rs) owns its KV cache,
//!   Sequence::prefill / decode               sampler (sampler.rs), stop strings (stop.rs) and
//!        │                                   streaming detokenizer (tokenizer.rs)
//!        ▼ Event::{Started, Token, Done, Error}, one channel per generation
//! Generation (iterate, or await next_event); its Control pauses, resumes, cancels, re-tunes
//! ```
//!
//! ```no_run
//! use rill_engine::{Engine, EngineConfig, GenerateRequest, Message, Event, SamplingParams};
//! let engine = Engine::start(EngineConfig::new("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
//! let mut req = GenerateRequest::chat(vec![Message::user("What is the capital of France?")]);
//! req.params = SamplingParams::greedy();
//! for event in engine.handle().generate(req)? {
//!     if let Event::Token { text, .. } = event { print!("{text}"); }
//! }
//! # Ok::<(), rill_engine::Error>(())
//! ```
//!
//! The crate knows nothing of SQLite, HTTP or Tauri; those wire it up from outside.
//!
//! ## Layers
//!
//! Modules import downward only (`scripts/check-layers.py` fails `make test` on a circle). From
//! the ground up: `error`, `message` (a conversation's words), `system`, `stop`, `scheduler`,
//! `weigh`; `kernels`, `sampler`, `tools`; `gguf`, `event`, `reasoning`; `template`,
//! `tokenizer`; `model`, `constraint`, `vision`; `request`, `config`, `hub`, `prefix_cache`;
//! `prompting`, `sequence`; `draft`; `command`; `generation`, `worker`; `handle`; `engine`.
//! Inside `model/`, the block (`decoder.rs`) is written once over a backend (`backend.rs`:
//! `host.rs` on our kernels, `device.rs` on candle's tensors). docs/architecture.md says what
//! each layer holds.

mod command;
mod config;
pub mod constraint;
mod draft;
pub mod engine;
pub mod error;
pub mod event;
pub mod generation;
pub mod gguf;
pub mod handle;
pub mod hub;
pub mod kernels;
pub mod message;
pub mod model;
pub(crate) mod prefix_cache;
mod prompting;
pub mod reasoning;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub(crate) mod sequence;
pub mod stop;
mod system;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod vision;
mod weigh;
mod worker;

pub use config::{DeviceKind, EngineConfig};
pub use constraint::Grammar;
pub use draft::DraftInfo;
pub use engine::Engine;
pub use error::{Error, Result};
pub use event::{Activity, Event, Timings, Usage};
pub use generation::{Collected, Control, Generation};
pub use handle::Handle;
pub use message::ImageData;
pub use model::{inspect, KvType, ModelInfo};
pub use request::{
    ChatArgs, GenerateRequest, Overflow, PreviewRequest, Prompt, Speculation, MAX_PRIORITY,
};
pub use sampler::{Candidate, Distribution, SamplingParams, Shaped};
pub use scheduler::SequenceState;
pub use stop::StopReason;
pub use template::{Message, Role, Thinking, ToolCall};
