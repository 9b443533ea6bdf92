//! The model commands: the models on this machine and the catalogue, loading one, importing a
//! file (through a dialog opened here), and downloads from Hugging Face with progress, retry and
//! cancel.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_engine::hub::{self, DownloadProgress, LocalModel};
use rill_engine::ModelInfo;
use serde::{Deserialize, Serialize};
use tauri::ipc::Channel;
use tauri::{AppHandle, Manager, State};

use crate::error::{CommandError, Result};
use crate::local_models::{blocking, check_on_this_machine};
use crate::state::AppState;
use crate::steering::api_settings;

/// A recommended model (assets/catalogue.json).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CatalogueEntry {
    pub name: String,
    /// The model's family, as the models list names it ("Qwen3", "Gemma 3").
    pub family: String,
    pub spec: String,
    pub description: String,
    pub size_bytes: u64,
    pub ram_bytes: u64,
    #[serde(default)]
    pub recommended: bool,
    /// The vision projector (`mmproj-*.gguf`) in the same repository, fetched with the model
    /// so that it reads images (its size is in `size_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projector: Option<String>,
}

#[derive(Serialize)]
pub struct Models {
    pub loaded: Option<ModelInfo>,
    pub local: Vec<LocalModel>,
    pub catalogue: Vec<CatalogueEntry>,
    /// This machine's memory, where it can be read: the window warns before a download whose
    /// `ram_bytes` is more.
    pub machine_ram_bytes: Option<u64>,
}

#[derive(Clone, Serialize)]
#[serde(tag = "event", content = "data", rename_all = "snake_case")]
pub enum DownloadEvent {
    Progress {
        file: String,
        done_bytes: u64,
        total_bytes: u64,
        bytes_per_second: f64,
    },
    Done {
        path: PathBuf,
    },
    Error {
        kind: &'static str,
        message: String,
    },
}

pub fn catalogue() -> Vec<CatalogueEntry> {
    // Built in at compile time; a parse error fails the crate's tests, never the app.
    serde_json::from_str(include_str!("../../assets/catalogue.json")).unwrap_or_default()
}

#[tauri::command]
pub async fn models(state: State<'_, AppState>) -> Result<Models> {
    let dir = state.models_dir.clone();
    let local = tauri::async_runtime::spawn_blocking(move || hub::list(&dir))
        .await
        .map_err(|e| CommandError::Invalid(e.to_string()))?;
    Ok(Models {
        loaded: state.model(),
        local,
        catalogue: catalogue(),
        machine_ram_bytes: hub::machine_memory(),
    })
}

/// Loads one of the models on this machine (`models`' list: the models folder, imported
/// files, the Hugging Face cache). Any other path is refused: a new file comes in through
/// [`import_model`], which asks the user for it.
#[tauri::command]
pub async fn select_model(app: AppHandle, path: PathBuf) -> Result<ModelInfo> {
    let dir = app.state::<AppState>().models_dir.clone();
    check_on_this_machine(dir, &path).await?;
    load(&app, path).await
}

/// Asks the user for a GGUF file, registers it where it lies (never copied) and loads it.
/// `None` when the user cancelled.
#[tauri::command]
pub async fn import_model(app: AppHandle) -> Result<Option<ModelInfo>> {
    let filter = crate::dialogs::Filter {
        name: "GGUF model",
        extensions: &["gguf"],
    };
    let Some(path) = crate::dialogs::pick_file(&app, filter).await? else {
        return Ok(None);
    };
    let dir = app.state::<AppState>().models_dir.clone();
    let info = blocking(move || hub::import(&dir, &path)).await??;
    load(&app, info.path).await.map(Some)
}

pub async fn load(app: &AppHandle, path: PathBuf) -> Result<ModelInfo> {
    let app2 = app.clone();
    let p = path.clone();
    let info = blocking(move || app2.state::<AppState>().load(p)).await??;
    let state = app.state::<AppState>();
    let value = serde_json::Value::String(path.to_string_lossy().into_owned());
    state.store.set_setting("model", &value).await?;
    // The API serves the model in use: start it (or move it) onto the new one.
    let api = api_settings(&state).await;
    if api.enabled {
        if let Err(e) = state.start_api(&api).await {
            tracing::warn!(error = %e, "could not start the API");
        }
    }
    Ok(info)
}

struct ChannelProgress {
    channel: Channel<DownloadEvent>,
    cancel: Arc<AtomicBool>,
    file: String,
    total: u64,
    done: u64,
    started: Instant,
    last_sent: Instant,
}

impl DownloadProgress for ChannelProgress {
    fn start(&mut self, file: &str, total_bytes: usize) {
        self.file = file.to_owned();
        self.total = total_bytes as u64;
        self.done = 0;
        self.started = Instant::now();
    }

    fn advance(&mut self, bytes: usize) {
        self.done += bytes as u64;
        // A few updates a second is smooth for a progress bar and cheap for the page.
        if self.last_sent.elapsed() >= Duration::from_millis(150) {
            self.last_sent = Instant::now();
            self.send();
        }
    }

    fn finish(&mut self) {
        self.send();
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

impl ChannelProgress {
    fn send(&self) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let _ = self.channel.send(DownloadEvent::Progress {
            file: self.file.clone(),
            done_bytes: self.done,
            total_bytes: self.total,
            bytes_per_second: self.done as f64 / secs,
        });
    }
}

/// Downloads `OWNER/REPO` or `OWNER/REPO:FILE.gguf` from Hugging Face (retried, resumed after
/// an interruption or a restart), then loads it. Progress goes to `on_progress`.
#[tauri::command]
pub async fn download_model(
    app: AppHandle,
    spec: String,
    on_progress: Channel<DownloadEvent>,
) -> Result<ModelInfo> {
    let cancel = Arc::new(AtomicBool::new(false));
    if !app
        .state::<AppState>()
        .start_download(&spec, cancel.clone())
    {
        return Err(CommandError::Invalid(format!(
            "{spec} is already downloading"
        )));
    }
    let mut progress = ChannelProgress {
        channel: on_progress.clone(),
        cancel,
        file: String::new(),
        total: 0,
        done: 0,
        started: Instant::now(),
        last_sent: Instant::now(),
    };
    // A catalogue model that reads images brings its projector, into the same folder of the
    // Hugging Face cache, where the engine pairs them (`vision::beside`).
    let projector = catalogue()
        .into_iter()
        .find(|e| e.spec == spec)
        .and_then(|e| e.projector)
        .map(|file| format!("{}:{file}", spec.split(':').next().unwrap_or(&spec)));
    let spec2 = spec.clone();
    let result = blocking(move || {
        let model = hub::pull(&spec2, &mut progress)?;
        if let Some(projector) = projector {
            hub::pull(&projector, &mut progress)?;
        }
        Ok::<_, rill_engine::Error>(model)
    })
    .await;
    app.state::<AppState>().end_download(&spec);
    let result = match result {
        Ok(Ok(path)) => load(&app, path).await,
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(e),
    };
    let _ = on_progress.send(match &result {
        Ok(info) => DownloadEvent::Done {
            path: info.path.clone(),
        },
        Err(e) => DownloadEvent::Error {
            kind: if matches!(
                e,
                CommandError::Engine(rill_engine::Error::DownloadCancelled)
            ) {
                "cancelled"
            } else {
                "failed"
            },
            message: e.to_string(),
        },
    });
    result
}

#[tauri::command]
pub fn cancel_download(state: State<'_, AppState>, spec: String) -> bool {
    state.cancel_download(&spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_catalogue_parses_and_names_one_recommended_model() {
        let c = catalogue();
        assert!(c.len() >= 3, "{c:?}");
        assert_eq!(c.iter().filter(|e| e.recommended).count(), 1);
        // Every entry is of a family Rill runs, named as the models list names it.
        let runs: Vec<String> = rill_engine::model::family::FAMILIES
            .iter()
            .map(|f| rill_engine::model::family::label(f.arch))
            .collect();
        for e in &c {
            assert!(e.spec.contains('/'), "{}", e.spec);
            assert!(e.ram_bytes >= e.size_bytes, "{}", e.name);
            assert!(runs.contains(&e.family), "{}: {}", e.name, e.family);
        }
        // A projector is a file name in its model's repository.
        let seeing: Vec<_> = c.iter().filter_map(|e| e.projector.as_ref()).collect();
        assert!(!seeing.is_empty());
        for p in seeing {
            rill_engine::hub::check_file_name(p).unwrap();
            assert!(
                rill_engine::vision::is_projector(std::path::Path::new(p)),
                "{p}"
            );
        }
        for family in ["Qwen3", "Qwen3.5", "Gemma 3", "Phi-3", "Qwen2"] {
            assert!(c.iter().any(|e| e.family == family), "no {family} model");
        }
    }
}
