//! # rill-app
//!
//! The desktop shell: a Tauri window over the same engine, store and answer loop the CLI and
//! the API use. It has no logic of its own: [`commands`] are a few typed lines each over
//! [`state::AppState`] (the store, the engine handle, the running answers, the downloads).
//!
//! Start-up: the store opens (`RILL_DB`, default `rill.db` in the platform data dir; answers a
//! crash left `streaming` become `interrupted`), then a model loads in the background:
//! `RILL_MODEL`, else the one chosen last time, else the first one found on this machine. With
//! none, the window offers the recommended download and the import of a file.

pub mod chat_event;
pub mod commands;
pub mod dialogs;
pub mod error;
pub mod files;
pub mod local_models;
pub mod models;
pub mod panel;
pub mod remote;
pub mod secrets;
pub mod state;
pub mod steering;

use std::path::PathBuf;

use anyhow::Context;
use tauri::Manager;

use crate::state::AppState;

fn database_path() -> PathBuf {
    match std::env::var_os("RILL_DB") {
        Some(p) => PathBuf::from(p),
        None => dirs::data_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join("rill")
            .join("rill.db"),
    }
}

/// Which model to load at start, if any.
async fn startup_model(state: &AppState) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RILL_MODEL") {
        return Some(PathBuf::from(p));
    }
    if let Ok(Some(serde_json::Value::String(p))) = state.store.setting("model").await {
        if std::path::Path::new(&p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    let dir = state.models_dir.clone();
    let local = tauri::async_runtime::spawn_blocking(move || rill_engine::hub::list(&dir))
        .await
        .ok()?;
    // The first file that can run: one that cannot is listed with its error, never loaded.
    local
        .iter()
        .find(|m| m.error.is_none() && m.info.runs)
        .map(|m| m.info.path.clone())
}

/// Builds and runs the app on `builder`.
pub fn run(builder: tauri::Builder<tauri::Wry>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let db = database_path();
    if let Some(parent) = db.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let store = tauri::async_runtime::block_on(rill_store::Store::open(&db))
        .with_context(|| format!("cannot open the conversation database {}", db.display()))?;
    let state = AppState::new(
        store,
        rill_engine::hub::models_dir(),
        crate::secrets::Secrets::for_user(),
    );

    builder
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_opener::init())
        .manage(state)
        .setup(|app| {
            let handle = app.handle().clone();
            tauri::async_runtime::spawn(async move {
                let state = handle.state::<AppState>();
                if let Some(path) = startup_model(&state).await {
                    tracing::info!(model = %path.display(), "loading");
                    if let Err(e) = commands::load(&handle, path).await {
                        tracing::warn!(error = %e, "could not load the model");
                    }
                }
            });
            Ok(())
        })
        .invoke_handler(tauri::generate_handler![
            commands::status,
            commands::list_conversations,
            commands::create_conversation,
            commands::rename_conversation,
            commands::set_pinned,
            commands::delete_conversation,
            commands::search_conversations,
            files::export_conversation,
            files::import_conversation,
            commands::open_conversation,
            commands::set_system_prompt,
            commands::set_params,
            commands::context_usage,
            commands::presets,
            commands::save_preset,
            commands::delete_preset,
            commands::send_message,
            commands::message_image,
            commands::regenerate,
            commands::edit_message,
            commands::switch_branch,
            commands::continue_answer,
            steering::stop,
            steering::pause,
            steering::resume,
            steering::set_priority,
            models::models,
            models::select_model,
            models::import_model,
            models::download_model,
            models::cancel_download,
            steering::api_status,
            steering::set_api,
            steering::message_tokens,
            files::export_answer,
            steering::preview_next,
            steering::activity,
            files::open_link,
        ])
        .run(tauri::generate_context!())
        .context("the window failed")?;
    Ok(())
}
