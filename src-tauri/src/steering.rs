//! The page's commands about answers in flight and the local API: each token's candidates,
//! the next answer's first-token preview, the activity view, stop, pause, resume and priority
//! for a running answer, and the API's toggle.

use rill_engine::Prompt;
use serde::Serialize;
use tauri::State;

use crate::error::Result;
use crate::panel::PanelSettings;
use crate::state::{ApiSettings, AppState};

// ---- probabilities and activity -----------------------------------------------------------

/// An answer's tokens with their candidates; `None` when it kept none.
#[tauri::command]
pub async fn message_tokens(
    state: State<'_, AppState>,
    message: i64,
) -> Result<Option<serde_json::Value>> {
    Ok(state.store.message_tokens(message).await?)
}

/// A candidate of the next-token preview, with its text.
#[derive(Serialize)]
pub struct PreviewToken {
    pub id: u32,
    pub text: String,
    pub raw: f32,
    pub softened: f32,
    pub sampled: f32,
}

#[derive(Serialize)]
pub struct Preview {
    /// The message whose first token this is the distribution of.
    pub message: Option<i64>,
    pub candidates: Vec<PreviewToken>,
    pub after_top_k: usize,
    pub after_top_p: usize,
    pub min_p_floor: f32,
    pub kept: usize,
}

/// The distribution the first token of the chat's next answer (a regenerate of its last
/// answer, or the answer to its last question) is drawn from under `settings`. `None` when
/// the chat has no question yet or answers on a remote server.
#[tauri::command]
pub async fn preview_next(
    state: State<'_, AppState>,
    conversation: i64,
    settings: PanelSettings,
) -> Result<Option<Preview>> {
    settings.params.validate()?;
    let conv = state.store.conversation(conversation).await?;
    if PanelSettings::from_json(&conv.settings).remote.is_some() {
        return Ok(None);
    }
    let handle = state.handle()?;
    let Some(leaf) = conv.current_leaf_id else {
        return Ok(None);
    };
    let leaf = state.store.message(leaf).await?;
    let (parent, answer) = match leaf.role {
        rill_store::Role::Assistant => (leaf.parent_id, Some(leaf.id)),
        _ => (Some(leaf.id), None),
    };
    let messages = rill_chat::prompt_under(&state.store, conversation, parent).await?;
    if !messages.iter().any(|m| m.role == rill_engine::Role::User) {
        return Ok(None);
    }
    let d = handle
        .preview(rill_engine::PreviewRequest {
            prompt: Prompt::Messages(messages),
            params: settings.params,
            top: 12,
        })
        .await?;
    Ok(Some(Preview {
        message: answer,
        candidates: d
            .candidates
            .iter()
            .map(|c| PreviewToken {
                id: c.id,
                text: rill_chat::token_text(&handle, c.id),
                raw: c.raw,
                softened: c.softened,
                sampled: c.sampled,
            })
            .collect(),
        after_top_k: d.after_top_k,
        after_top_p: d.after_top_p,
        min_p_floor: d.min_p_floor,
        kept: d.kept,
    }))
}

/// One running answer in the activity view.
#[derive(Serialize)]
pub struct ActivityItem {
    pub message: i64,
    pub conversation: i64,
    pub title: String,
    /// queued, prefilling, decoding, paused (the engine's), or remote.
    pub state: String,
    pub priority: u8,
    pub prompt_tokens: usize,
    pub prefilled: usize,
    pub completion_tokens: usize,
    /// Its share of the machine's recent forward passes, 0..1.
    pub share: f32,
}

/// Every answer being written, with what the engine is doing for it.
#[tauri::command]
pub async fn activity(state: State<'_, AppState>) -> Result<Vec<ActivityItem>> {
    let engine = state.handle().map(|h| h.activity()).unwrap_or_default();
    let mut items = Vec::new();
    for (message, live) in state.live_answers() {
        let title = state
            .store
            .conversation(live.conversation)
            .await
            .map(|c| c.title)
            .unwrap_or_default();
        let mut item = ActivityItem {
            message,
            conversation: live.conversation,
            title,
            state: "remote".into(),
            priority: 1,
            prompt_tokens: 0,
            prefilled: 0,
            completion_tokens: 0,
            share: 0.0,
        };
        if let crate::state::Steer::Local(control) = &live.steer {
            // Between its start and the engine's next round it is not in the snapshot yet.
            item.state = "queued".into();
            if let Some(a) = engine.iter().find(|a| a.id == control.id()) {
                item.state = serde_json::to_value(a.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                item.priority = a.priority;
                item.prompt_tokens = a.prompt_tokens;
                item.prefilled = a.prefilled;
                item.completion_tokens = a.completion_tokens;
                item.share = a.share;
            }
        }
        items.push(item);
    }
    items.sort_by_key(|i| i.message);
    Ok(items)
}

// ---- generation control -------------------------------------------------------------------

#[tauri::command]
pub fn stop(state: State<'_, AppState>, message: i64) -> Result<()> {
    state.live(message)?.stop()
}

#[tauri::command]
pub fn pause(state: State<'_, AppState>, message: i64) -> Result<()> {
    Ok(state.live(message)?.local()?.pause()?)
}

#[tauri::command]
pub fn resume(state: State<'_, AppState>, message: i64) -> Result<()> {
    Ok(state.live(message)?.local()?.resume()?)
}

/// Decode steps per round relative to other answers (1 = an equal share).
#[tauri::command]
pub fn set_priority(state: State<'_, AppState>, message: i64, priority: u8) -> Result<()> {
    Ok(state.live(message)?.local()?.set_priority(priority)?)
}

// ---- the API ------------------------------------------------------------------------------

#[derive(Serialize)]
pub struct ApiStatus {
    pub settings: ApiSettings,
    /// `http://HOST:PORT` while it serves.
    pub address: Option<String>,
    pub requests: Vec<rill_server::LoggedRequest>,
}

/// The API toggle's settings: from the database, with the key from the secrets file (issue
/// 40). A key an older version left in the database moves to the secrets file here.
pub async fn api_settings(state: &AppState) -> ApiSettings {
    let mut settings: ApiSettings = match state.store.setting("api").await {
        Ok(Some(v)) => serde_json::from_value(v).unwrap_or_default(),
        _ => ApiSettings::default(),
    };
    if let Some(old) = settings.api_key.take().filter(|k| !k.trim().is_empty()) {
        let moved = state.secrets.set_app_api_key(Some(&old)).is_ok()
            && state
                .store
                .set_setting("api", &serde_json::to_value(&settings).unwrap_or_default())
                .await
                .is_ok();
        if !moved {
            tracing::warn!("the API key could not be moved to the secrets file");
            settings.api_key = Some(old);
            return settings;
        }
    }
    settings.api_key = state.secrets.app_api_key();
    settings
}

#[tauri::command]
pub async fn api_status(state: State<'_, AppState>) -> Result<ApiStatus> {
    let settings = api_settings(&state).await;
    let (address, requests) = state
        .api()
        .map_or((None, Vec::new()), |(a, r)| (Some(a), r));
    Ok(ApiStatus {
        settings,
        address,
        requests,
    })
}

/// The API toggle: saves the settings, then serves (or stops serving) with them.
#[tauri::command]
pub async fn set_api(state: State<'_, AppState>, settings: ApiSettings) -> Result<ApiStatus> {
    state.stop_api();
    if settings.enabled {
        state.start_api(&settings).await?;
    }
    // The key goes to the secrets file, the rest to the database.
    let key = settings.api_key.as_deref().filter(|k| !k.trim().is_empty());
    state.secrets.set_app_api_key(key.map(str::trim))?;
    let kept = ApiSettings {
        api_key: None,
        ..settings
    };
    state
        .store
        .set_setting("api", &serde_json::to_value(&kept).unwrap_or_default())
        .await?;
    api_status(state).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40: the app's own API key lives in the secrets file; one an older Rill kept in
    /// the database moves there the first time the settings are read.
    #[tokio::test]
    async fn the_api_key_moves_from_the_database_to_the_secrets_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = rill_store::Store::open(&dir.path().join("rill.db"))
            .await
            .unwrap();
        let secrets = crate::secrets::Secrets::at(dir.path().join("secrets.json"));
        let state = AppState::new(store, dir.path().join("models"), secrets);
        let old = serde_json::json!({"enabled": false, "host": "127.0.0.1", "port": 8080,
            "api_key": "sk-old", "save": false});
        state.store.set_setting("api", &old).await.unwrap();
        let settings = api_settings(&state).await;
        assert_eq!(settings.api_key.as_deref(), Some("sk-old"));
        assert_eq!(settings.port, 8080);
        let kept = state.store.setting("api").await.unwrap().unwrap();
        assert!(kept["api_key"].is_null(), "{kept}");
        assert_eq!(state.secrets.app_api_key().as_deref(), Some("sk-old"));
        let text = std::fs::read_to_string(dir.path().join("secrets.json")).unwrap();
        assert!(text.contains("sk-old"));
    }
}
