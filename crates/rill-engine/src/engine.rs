//! The [`Engine`]: loads the model and starts the inference thread.
//!
//! [`Engine::start`] loads the model and spawns one plain OS thread (compute must not starve an
//! async runtime) that owns the weights and every live sequence (`worker.rs`). Requests and
//! control messages reach it through a channel ([`crate::Handle`], `command.rs`); each
//! generation's events leave through a channel of its own, which the caller holds as a
//! [`crate::Generation`]. Dropping a `Generation` cancels it and frees its cache.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::command::{Command, Shared};
use crate::config::{EngineConfig, DEFAULT_CONTEXT_CAP};
use crate::constraint::Grammars;
use crate::error::{Error, Result};
use crate::handle::Handle;
use crate::model::Model;
use crate::system::available_memory;
use crate::vision::{Projector, Vision};
use crate::worker::{self, Worker};

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
        let shape = (weights.config().hidden, weights.config().deepstack);
        let vision = pool.install(|| load_vision(&config, &tokenizer, shape))?;
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
            panels_pending: AtomicBool::new(
                weights.panels_pending() || draft.as_ref().is_some_and(|d| d.panels_pending()),
            ),
            draft: Mutex::new(draft_info),
            locked_weight_bytes,
            vision,
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

/// The vision projector of [`EngineConfig::projector`], else the one beside the model.
fn load_vision(
    config: &EngineConfig,
    tokenizer: &crate::tokenizer::Tokenizer,
    (hidden, deepstack): (usize, usize),
) -> Result<Option<Vision>> {
    let pair = |path: &std::path::Path| {
        Projector::load(path).and_then(|p| Vision::new(p, tokenizer, hidden, deepstack))
    };
    if let Some(path) = &config.projector {
        return pair(path).map(Some);
    }
    let Some(path) = crate::vision::beside(&config.model) else {
        return Ok(None);
    };
    match pair(&path) {
        Ok(v) => Ok(Some(v)),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the projector beside the model is left aside");
            Ok(None)
        }
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
