//! The page's commands. Each is a few typed lines over the engine handle, the store and
//! `rill_chat` (which answers and saves, the same way the CLI and the API do). Tokens reach the
//! page through a `Channel<ChatEvent>` per answer.

use std::collections::HashMap;
use std::path::PathBuf;

use rill_engine::{Event, ModelInfo, Prompt};
use rill_store::{Conversation, Message, NewConversation, NewMessage, SearchHit};
use serde::Serialize;
use tauri::ipc::Channel;
use tauri::{AppHandle, Manager, State};

pub use crate::models::load;

use crate::chat_event::ChatEvent;
use crate::error::{CommandError, Result};
use crate::panel::{PanelSettings, RemoteBackend};
use crate::state::{AppState, LiveAnswer};

// ---- wire types ---------------------------------------------------------------------------

/// A message on the shown branch, with its siblings (for the "2/3" arrows).
#[derive(Serialize)]
pub struct ViewMessage {
    #[serde(flatten)]
    pub message: Message,
    /// Ids of this message and its siblings, oldest first.
    pub siblings: Vec<i64>,
}

#[derive(Serialize)]
pub struct ConversationView {
    pub conversation: Conversation,
    pub settings: PanelSettings,
    pub messages: Vec<ViewMessage>,
}

#[derive(Serialize)]
pub struct Sent {
    pub user: Message,
    pub answer_id: i64,
}

#[derive(Serialize)]
pub struct AppStatus {
    pub model: Option<ModelInfo>,
    pub models_dir: PathBuf,
    pub database: PathBuf,
    pub live: Vec<i64>,
    pub version: &'static str,
}

#[derive(Serialize)]
pub struct ContextUsage {
    pub used_tokens: usize,
    pub context_length: usize,
    /// What happens when it is full: the oldest turns are left out (the system prompt stays).
    pub overflow: &'static str,
}

// ---- app ----------------------------------------------------------------------------------

#[tauri::command]
pub fn status(state: State<'_, AppState>) -> AppStatus {
    AppStatus {
        model: state.model(),
        models_dir: state.models_dir.clone(),
        database: state.store.path().to_path_buf(),
        live: state.live_ids(),
        version: env!("CARGO_PKG_VERSION"),
    }
}

// ---- conversations ------------------------------------------------------------------------

#[tauri::command]
pub async fn list_conversations(state: State<'_, AppState>) -> Result<Vec<Conversation>> {
    Ok(state.store.list_conversations(false).await?)
}

#[tauri::command]
pub async fn create_conversation(state: State<'_, AppState>) -> Result<Conversation> {
    let defaults = state.store.setting("panel").await?;
    let settings = defaults
        .map(|v| PanelSettings::from_json(&v))
        .unwrap_or_default();
    let system_prompt = state
        .store
        .setting("system_prompt")
        .await?
        .and_then(|v| v.as_str().map(str::to_owned));
    Ok(state
        .store
        .create_conversation(NewConversation {
            model: state.model().map(|m| m.name),
            system_prompt,
            settings: Some(settings.to_json()),
        })
        .await?)
}

#[tauri::command]
pub async fn rename_conversation(state: State<'_, AppState>, id: i64, title: String) -> Result<()> {
    Ok(state.store.rename(id, &title).await?)
}

#[tauri::command]
pub async fn set_pinned(state: State<'_, AppState>, id: i64, pinned: bool) -> Result<()> {
    Ok(state.store.set_pinned(id, pinned).await?)
}

#[tauri::command]
pub async fn delete_conversation(state: State<'_, AppState>, id: i64) -> Result<()> {
    for answer in state.live_in(id) {
        let _ = answer.stop(); // it may have just finished: nothing left to stop
    }
    Ok(state.store.delete_conversation(id).await?)
}

#[tauri::command]
pub async fn search_conversations(
    state: State<'_, AppState>,
    query: String,
) -> Result<Vec<SearchHit>> {
    Ok(state.store.search(&query, 50).await?)
}

#[tauri::command]
pub async fn open_conversation(state: State<'_, AppState>, id: i64) -> Result<ConversationView> {
    view(&state, id).await
}

async fn view(state: &AppState, id: i64) -> Result<ConversationView> {
    let conversation = state.store.conversation(id).await?;
    // One query for the whole tree; the branch and the sibling lists are worked out here, so a
    // conversation of 10,000 messages opens in one round trip.
    let all = state.store.all_messages(id).await?;
    let mut children: HashMap<Option<i64>, Vec<i64>> = HashMap::new();
    let mut by_id: HashMap<i64, &Message> = HashMap::new();
    for m in &all {
        children.entry(m.parent_id).or_default().push(m.id);
        by_id.insert(m.id, m);
    }
    let mut path = Vec::new();
    let mut at = conversation.current_leaf_id;
    while let Some(m) = at.and_then(|id| by_id.get(&id)) {
        path.push(ViewMessage {
            message: (*m).clone(),
            siblings: children.get(&m.parent_id).cloned().unwrap_or_default(),
        });
        at = m.parent_id;
    }
    path.reverse();
    Ok(ConversationView {
        settings: settings_of(state, &conversation).await?,
        conversation,
        messages: path,
    })
}

/// A conversation's panel settings, saying whether a key is kept for its remote server (never
/// the key). A key found in the settings themselves (an older Rill kept it there) moves to the
/// secrets file, and the settings are written again without it (issue 13).
async fn settings_of(state: &AppState, conv: &Conversation) -> Result<PanelSettings> {
    let mut settings = PanelSettings::from_json(&conv.settings);
    if let Some(r) = settings.remote.as_mut() {
        if let Some(key) = r.api_key.take().filter(|k| !k.is_empty()) {
            state.secrets.set_remote_key(&r.url, Some(&key))?;
            state
                .store
                .set_settings(conv.id, &settings.to_json())
                .await?;
        }
    }
    if let Some(r) = settings.remote.as_mut() {
        r.has_key = state.secrets.remote_key(&r.url).is_some();
    }
    Ok(settings)
}

#[tauri::command]
pub async fn set_system_prompt(
    state: State<'_, AppState>,
    id: i64,
    prompt: Option<String>,
) -> Result<()> {
    let prompt = prompt.filter(|p| !p.trim().is_empty());
    state.store.set_system_prompt(id, prompt.as_deref()).await?;
    let value = prompt.map_or(serde_json::Value::Null, serde_json::Value::String);
    Ok(state.store.set_setting("system_prompt", &value).await?)
}

/// The panel moved: checks the values, keeps them for the conversation (and as the default
/// for new ones), and hands them to its running answer, which uses them from the next token.
#[tauri::command]
pub async fn set_params(
    state: State<'_, AppState>,
    conversation: i64,
    settings: PanelSettings,
) -> Result<()> {
    let mut settings = settings;
    settings.params.validate()?;
    settings.check(state.handle().ok().as_ref())?;
    // A draft model chosen in the panel loads now, so a wrong file is refused as it is chosen.
    if let (Ok(handle), None) = (state.handle(), &settings.remote) {
        settings.ensure_draft(&handle, &state.models_dir).await?;
    }
    if let Some(r) = settings.remote.as_mut() {
        r.validate()?;
        // The key goes to the secrets file, never into the settings: "" forgets it, no key
        // keeps the one there is.
        match r.api_key.take() {
            Some(k) if k.trim().is_empty() => state.secrets.set_remote_key(&r.url, None)?,
            Some(k) => state.secrets.set_remote_key(&r.url, Some(k.trim()))?,
            None => {}
        }
        r.has_key = state.secrets.remote_key(&r.url).is_some();
    }
    for answer in state.live_in(conversation) {
        if let Ok(control) = answer.local() {
            control.set_params(settings.params.clone())?;
            control.set_max_tokens(settings.max_tokens)?;
        }
    }
    state
        .store
        .set_settings(conversation, &settings.to_json())
        .await?;
    // The defaults for new chats: the sampling values, not this chat's backend, nor its
    // draft model (a file that drafts only for the model loaded now).
    let drafting = settings.speed_up == rill_engine::Speculation::Draft;
    let defaults = PanelSettings {
        remote: None,
        speed_up: if drafting {
            rill_engine::Speculation::Off
        } else {
            settings.speed_up
        },
        draft_model: None,
        ..settings
    };
    Ok(state
        .store
        .set_setting("panel", &defaults.to_json())
        .await?)
}

#[tauri::command]
pub async fn presets(state: State<'_, AppState>) -> Result<Vec<rill_store::Preset>> {
    Ok(state.store.presets().await?)
}

#[tauri::command]
pub async fn save_preset(
    state: State<'_, AppState>,
    name: String,
    settings: PanelSettings,
) -> Result<()> {
    if name.trim().is_empty() {
        return Err(CommandError::Invalid("a preset needs a name".into()));
    }
    settings.params.validate()?;
    Ok(state
        .store
        .save_preset(name.trim(), &settings.to_json())
        .await?)
}

#[tauri::command]
pub async fn delete_preset(state: State<'_, AppState>, name: String) -> Result<()> {
    Ok(state.store.delete_preset(&name).await?)
}

#[tauri::command]
pub async fn context_usage(state: State<'_, AppState>, conversation: i64) -> Result<ContextUsage> {
    let handle = state.handle()?;
    let conv = state.store.conversation(conversation).await?;
    let path = state.store.current_path(conversation).await?;
    let messages =
        rill_chat::history_with_images(&state.store, conv.system_prompt.as_deref(), &path).await?;
    let used_tokens = handle.tokenize_prompt(&Prompt::Messages(messages))?.len();
    Ok(ContextUsage {
        used_tokens,
        context_length: handle.context_length(),
        overflow: "drop_oldest",
    })
}

// ---- messages -----------------------------------------------------------------------------

#[tauri::command]
pub async fn send_message(
    app: AppHandle,
    state: State<'_, AppState>,
    conversation: i64,
    text: String,
    images: Option<Vec<String>>,
    on_event: Channel<ChatEvent>,
) -> Result<Sent> {
    let images = images.unwrap_or_default();
    if text.trim().is_empty() && images.is_empty() {
        return Err(CommandError::Invalid("the message is empty".into()));
    }
    let chat = Chat::of(&state, conversation).await?;
    let images = chat.check_images(images).await?;
    let mut message = NewMessage::user(text);
    message.images = images;
    let user = state.store.append(conversation, message).await?;
    let answer_id = chat
        .answer(app, &state, conversation, Some(user.id), on_event)
        .await?;
    Ok(Sent { user, answer_id })
}

/// A stored picture (a message's `images` names them by hash), as a data URL for an `<img>`.
#[tauri::command]
pub async fn message_image(state: State<'_, AppState>, hash: String) -> Result<String> {
    let image = state.store.image(&hash).await?;
    Ok(rill_engine::ImageData::new(image.bytes).to_url())
}

/// A new answer to the same question, as a sibling branch of `message` (an assistant message).
#[tauri::command]
pub async fn regenerate(
    app: AppHandle,
    state: State<'_, AppState>,
    message: i64,
    on_event: Channel<ChatEvent>,
) -> Result<i64> {
    let m = state.store.message(message).await?;
    Chat::of(&state, m.conversation_id)
        .await?
        .answer(app, &state, m.conversation_id, m.parent_id, on_event)
        .await
}

/// Edits a user message: the new text is a sibling branch, answered at once.
#[tauri::command]
pub async fn edit_message(
    app: AppHandle,
    state: State<'_, AppState>,
    message: i64,
    text: String,
    on_event: Channel<ChatEvent>,
) -> Result<Sent> {
    let m = state.store.message(message).await?;
    let chat = Chat::of(&state, m.conversation_id).await?;
    let user = state.store.edit(message, &text).await?;
    let answer_id = chat
        .answer(app, &state, user.conversation_id, Some(user.id), on_event)
        .await?;
    Ok(Sent { user, answer_id })
}

#[tauri::command]
pub async fn switch_branch(state: State<'_, AppState>, message: i64) -> Result<ConversationView> {
    let m = state.store.message(message).await?;
    state.store.switch_branch(message).await?;
    view(&state, m.conversation_id).await
}

/// Continues a stopped or interrupted answer in place.
#[tauri::command]
pub async fn continue_answer(
    app: AppHandle,
    state: State<'_, AppState>,
    message: i64,
    on_event: Channel<ChatEvent>,
) -> Result<i64> {
    let handle = state.handle()?;
    let m = state.store.message(message).await?;
    let conv = state.store.conversation(m.conversation_id).await?;
    let settings = PanelSettings::from_json(&conv.settings);
    settings.ensure_draft(&handle, &state.models_dir).await?;
    // The store refuses a second writer (an answer already streaming, here or elsewhere, or
    // one that ended done): a double click on Continue starts one generation (issue 13).
    let answering =
        rill_chat::begin_continue(&handle, &state.store, message, settings.options()).await?;
    stream(app, &state, m.conversation_id, answering, on_event)
}

/// Where a chat's answers come from, with its panel settings.
enum Backend {
    Local(rill_engine::Handle),
    Remote(RemoteBackend),
}

struct Chat {
    backend: Backend,
    settings: PanelSettings,
}

impl Chat {
    /// The chat's backend and settings. Fails before anything is written when the chat needs
    /// this machine's model and none is loaded (a chat on a remote server needs none).
    async fn of(state: &AppState, conversation: i64) -> Result<Chat> {
        let conv = state.store.conversation(conversation).await?;
        let mut settings = settings_of(state, &conv).await?;
        let backend = match settings.remote.take() {
            Some(mut remote) => {
                remote.api_key = state.secrets.remote_key(&remote.url);
                Backend::Remote(remote)
            }
            None => {
                let handle = state.handle()?;
                settings.ensure_draft(&handle, &state.models_dir).await?;
                Backend::Local(handle)
            }
        };
        Ok(Chat { backend, settings })
    }

    /// The question's pictures (data URLs) as bytes to store, refused before anything is
    /// written when this machine's model cannot read them. A remote server judges its own.
    async fn check_images(&self, urls: Vec<String>) -> Result<Vec<Vec<u8>>> {
        let images = urls
            .iter()
            .map(|u| rill_engine::ImageData::from_url(u).map_err(rill_engine::Error::Image))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if let Backend::Local(handle) = &self.backend {
            // Decoding a large picture takes a while: off the async runtime's threads.
            let (handle, checked) = (handle.clone(), images.clone());
            tauri::async_runtime::spawn_blocking(move || handle.check_images(&checked))
                .await
                .map_err(|e| CommandError::Invalid(format!("checking the images failed: {e}")))??;
        }
        Ok(images.iter().map(|i| i.bytes().to_vec()).collect())
    }

    /// Starts the answer under `parent`; it streams to `on_event` in the background.
    async fn answer(
        self,
        app: AppHandle,
        state: &AppState,
        conversation: i64,
        parent: Option<i64>,
        on_event: Channel<ChatEvent>,
    ) -> Result<i64> {
        match self.backend {
            Backend::Remote(remote) => {
                crate::remote::answer(
                    app,
                    state,
                    conversation,
                    parent,
                    self.settings,
                    remote,
                    on_event,
                )
                .await
            }
            Backend::Local(handle) => {
                let answering = rill_chat::begin(
                    &handle,
                    &state.store,
                    conversation,
                    parent,
                    self.settings.options(),
                )
                .await?;
                stream(app, state, conversation, answering, on_event)
            }
        }
    }
}

/// Runs the answer to its end in the background, forwarding its events to the page.
fn stream(
    app: AppHandle,
    state: &AppState,
    conversation: i64,
    answering: rill_chat::Answering,
    on_event: Channel<ChatEvent>,
) -> Result<i64> {
    let id = answering.message_id();
    state.track(
        id,
        LiveAnswer {
            conversation,
            steer: crate::state::Steer::Local(answering.control()),
        },
    )?;
    tauri::async_runtime::spawn(async move {
        // A page that went away (reload, closed window) does not stop the answer: it is
        // saved, and shown when the conversation is opened again.
        let forward = |e: &Event, probs: Option<&rill_chat::TokenProbs>| {
            if let Some(event) = ChatEvent::of(e, probs) {
                let _ = on_event.send(event);
            }
        };
        let result = answering.finish_with_probs(forward).await;
        let state = app.state::<AppState>();
        state.untrack(id);
        let last = match result {
            Ok(answer) => ChatEvent::Done {
                message: Box::new(answer.message),
            },
            Err(e) => {
                tracing::warn!(error = %e, answer = id, "answer failed");
                match state.store.message(id).await {
                    Ok(message) if message.status != rill_store::Status::Streaming => {
                        ChatEvent::Done {
                            message: Box::new(message),
                        }
                    }
                    _ => ChatEvent::Error {
                        message: e.to_string(),
                    },
                }
            }
        };
        let _ = on_event.send(last);
    });
    Ok(id)
}
