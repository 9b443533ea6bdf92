//! # rill-engine
//!
//! Everything between "messages + sampling settings" and "a stream of tokens".
//!
//! ```text
//! Handle::generate(GenerateRequest)          caller's thread: validate, template, tokenize
//!        │ Command::Add(Sequence)
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

mod config;
pub mod constraint;
mod draft;
pub mod engine;
pub mod error;
pub mod generation;
pub mod hub;
pub mod kernels;
pub mod model;
pub(crate) mod prefix_cache;
mod preview;
mod prompting;
pub mod reasoning;
pub mod sampler;
pub mod scheduler;
pub(crate) mod sequence;
pub mod stop;
pub mod template;
pub mod tokenizer;
pub mod tools;
mod weigh;
mod worker;

pub use constraint::Grammar;
pub use draft::DraftInfo;
pub use engine::{
    Activity, ChatArgs, Collected, Control, DeviceKind, Engine, EngineConfig, Event,
    GenerateRequest, Generation, Handle, Overflow, PreviewRequest, Prompt, Timings, Usage,
    MAX_PRIORITY,
};
pub use error::{Error, Result};
pub use model::{inspect, KvType, ModelInfo};
pub use sampler::{Candidate, Distribution, SamplingParams, Shaped};
pub use scheduler::SequenceState;
pub use sequence::Speculation;
pub use stop::StopReason;
pub use template::{Message, Role, Thinking, ToolCall};
