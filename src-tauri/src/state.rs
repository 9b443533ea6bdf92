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

/// The API toggle's settings (kept in the database as `api`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ApiSettings {
    pub enabled: bool,
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Keep API chats as conversations (never silently: off by default).
    pub save: bool,
}

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            enabled: false,
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            save: false,
        }
    }
}

/// How a running answer can be steered.
#[derive(Clone)]
pub enum Steer {
    /// An answer of this machine's engine: stop, pause, resume, live settings, priority.
    Local(Control),
    /// An answer streaming from a remote server: it can be stopped (the request is sent; the
    /// server owns its sampling, so the panel's changes apply from the next answer).
    Remote(Arc<tokio::sync::Notify>),
}

impl Steer {
    pub fn stop(&self) -> Result<()> {
        match self {
            Steer::Local(c) => Ok(c.cancel()?),
            Steer::Remote(stop) => {
                stop.notify_one();
                Ok(())
            }
        }
    }

    /// The engine's controls, for what only a local answer can do.
    pub fn local(&self) -> Result<&Control> {
        match self {
            Steer::Local(c) => Ok(c),
            Steer::Remote(_) => Err(CommandError::Invalid(
                "an answer from a remote server can only be stopped".into(),
            )),
        }
    }
}

/// One answer being written: which conversation it belongs to and how to steer it.
#[derive(Clone)]
pub struct LiveAnswer {
    pub conversation: i64,
    pub steer: Steer,
}

/// The OpenAI-compatible API, while the app serves it.
pub struct RunningApi {
    pub address: String,
    pub log: rill_server::RequestLog,
    stop: tokio::sync::oneshot::Sender<()>,
}

pub struct AppState {
    pub store: Store,
    pub models_dir: PathBuf,
    /// Keys for remote servers, apart from the conversations.
    pub secrets: crate::secrets::Secrets,
    engine: Mutex<Option<Engine>>,
    api: Mutex<Option<RunningApi>>,
    live: Mutex<HashMap<i64, LiveAnswer>>,
    downloads: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

/// A poisoned lock only means another command panicked mid-update of a plain map; the map is
/// still usable, so recover it instead of failing every later command.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AppState {
    pub fn new(store: Store, models_dir: PathBuf, secrets: crate::secrets::Secrets) -> Self {
        AppState {
            store,
            models_dir,
            secrets,
            engine: Mutex::new(None),
            api: Mutex::new(None),
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
    /// The previous engine stops after this; its running answers end as if stopped: kept,
    /// with everything they wrote, as `stopped` (and can be continued on the new model).
    pub fn load(&self, path: PathBuf) -> Result<ModelInfo> {
        let engine = Engine::start(EngineConfig::new(path))?;
        let info = engine.handle().model_info().clone();
        let old = lock(&self.engine).replace(engine);
        drop(old);
        Ok(info)
    }

    /// Starts serving the API on the current model (stopping a running one first).
    pub async fn start_api(&self, settings: &ApiSettings) -> Result<String> {
        self.stop_api();
        let handle = self.handle()?;
        let ip: std::net::IpAddr = settings.host.parse().map_err(|_| {
            CommandError::Invalid(format!("`{}` is not an IP address", settings.host))
        })?;
        let addr = std::net::SocketAddr::new(ip, settings.port);
        let log = rill_server::RequestLog::default();
        let config = rill_server::ServerConfig {
            api_key: settings.api_key.clone().filter(|k| !k.trim().is_empty()),
            store: settings.save.then(|| self.store.clone()),
            log: Some(log.clone()),
            ..Default::default()
        };
        let listener = rill_server::listen(addr, &config).await?;
        let address = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tauri::async_runtime::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = rill_server::serve_on(listener, handle, config, shutdown).await {
                tracing::warn!(error = %e, "the API server stopped");
            }
        });
        *lock(&self.api) = Some(RunningApi {
            address: address.clone(),
            log,
            stop,
        });
        Ok(address)
    }

    pub fn stop_api(&self) {
        if let Some(api) = lock(&self.api).take() {
            let _ = api.stop.send(()); // the server may have ended on its own
        }
    }

    /// Address and request log of the running API, if any.
    pub fn api(&self) -> Option<(String, Vec<rill_server::LoggedRequest>)> {
        lock(&self.api)
            .as_ref()
            .map(|a| (a.address.clone(), a.log.entries()))
    }

    /// Registers a running answer; refused when one already runs for that message (the store
    /// refuses a second writer first; this keeps the first one's controls whatever happens).
    pub fn track(&self, message: i64, answer: LiveAnswer) -> Result<()> {
        match lock(&self.live).entry(message) {
            std::collections::hash_map::Entry::Occupied(_) => Err(CommandError::Invalid(format!(
                "answer {message} is being written already"
            ))),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(answer);
                Ok(())
            }
        }
    }

    pub fn untrack(&self, message: i64) {
        lock(&self.live).remove(&message);
    }

    pub fn live(&self, message: i64) -> Result<Steer> {
        lock(&self.live)
            .get(&message)
            .map(|a| a.steer.clone())
            .ok_or(CommandError::NotRunning)
    }

    /// The running answers of a conversation (usually one).
    pub fn live_in(&self, conversation: i64) -> Vec<Steer> {
        lock(&self.live)
            .values()
            .filter(|a| a.conversation == conversation)
            .map(|a| a.steer.clone())
            .collect()
    }

    /// Every answer being written, by message id.
    pub fn live_answers(&self) -> Vec<(i64, LiveAnswer)> {
        lock(&self.live)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

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
