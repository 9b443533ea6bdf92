//! What the app holds between commands: the store, the loaded model's engine, the answers
//! running now (to steer them), and the downloads in flight (to cancel them).
//!
//! The engine is an actor (its own inference thread); the app keeps its `Engine` (dropping it
//! stops the thread) and hands out cheap `Handle` clones. The maps below are touched for
//! microseconds per command, never on the token path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use rill_engine::{Control, Engine, EngineConfig, Handle, ModelInfo};
use rill_store::Store;

use crate::error::{CommandError, Result};

/// One answer being written: which conversation it belongs to and how to steer it.
#[derive(Clone)]
pub struct LiveAnswer {
    pub conversation: i64,
    pub control: Control,
}

pub struct AppState {
    pub store: Store,
    pub models_dir: PathBuf,
    engine: Mutex<Option<Engine>>,
    live: Mutex<HashMap<i64, LiveAnswer>>,
    downloads: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

/// A poisoned lock only means another command panicked mid-update of a plain map; the map is
/// still usable, so recover it instead of failing every later command.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AppState {
    pub fn new(store: Store, models_dir: PathBuf) -> Self {
        AppState {
            store,
            models_dir,
            engine: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            downloads: Mutex::new(HashMap::new()),
        }
    }

    pub fn handle(&self) -> Result<Handle> {
        lock(&self.engine)
            .as_ref()
            .map(Engine::handle)
            .ok_or(CommandError::NoModel)
    }

    pub fn model(&self) -> Option<ModelInfo> {
        lock(&self.engine)
            .as_ref()
            .map(|e| e.handle().model_info().clone())
    }

    /// Loads a model (seconds: call it off the async runtime) and makes it the one in use.
    /// The previous engine stops after this; its running answers end with an error.
    pub fn load(&self, path: PathBuf) -> Result<ModelInfo> {
        let engine = Engine::start(EngineConfig::new(path))?;
        let info = engine.handle().model_info().clone();
        let old = lock(&self.engine).replace(engine);
        drop(old);
        Ok(info)
    }

    pub fn track(&self, message: i64, answer: LiveAnswer) {
        lock(&self.live).insert(message, answer);
    }

    pub fn untrack(&self, message: i64) {
        lock(&self.live).remove(&message);
    }

    pub fn live(&self, message: i64) -> Result<Control> {
        lock(&self.live)
            .get(&message)
            .map(|a| a.control.clone())
            .ok_or(CommandError::NotRunning)
    }

    /// The running answers of a conversation (usually one).
    pub fn live_in(&self, conversation: i64) -> Vec<Control> {
        lock(&self.live)
            .values()
            .filter(|a| a.conversation == conversation)
            .map(|a| a.control.clone())
            .collect()
    }

    /// Message ids of every running answer.
    pub fn live_ids(&self) -> Vec<i64> {
        lock(&self.live).keys().copied().collect()
    }

    /// Registers a download; false if the same one is already running.
    pub fn start_download(&self, spec: &str, cancel: Arc<AtomicBool>) -> bool {
        let mut d = lock(&self.downloads);
        if d.contains_key(spec) {
            return false;
        }
        d.insert(spec.to_owned(), cancel);
        true
    }

    pub fn end_download(&self, spec: &str) {
        lock(&self.downloads).remove(spec);
    }

    pub fn cancel_download(&self, spec: &str) -> bool {
        match lock(&self.downloads).get(spec) {
            Some(flag) => {
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}
