//! The commands that touch files or leave the app: export and import of conversations, an
//! answer's probabilities to a file, and links opened in the browser. None takes a path from
//! the page: each asks the user through a native dialog opened here ([`crate::dialogs`]) and
//! acts only on what the dialog returned, so the page can write or read no file of its own
//! choosing (issue 13).

use std::path::PathBuf;

use tauri::{AppHandle, State};
use tauri_plugin_opener::OpenerExt;

use crate::dialogs::{self, Filter};
use crate::error::{CommandError, Result};
use crate::state::AppState;

/// A file name from a title: what the dialog proposes.
fn file_name(title: &str, fallback: &str, ext: &str) -> String {
    let clean: String = title
        .chars()
        .map(|c| match c {
            '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' => '-',
            c if c.is_control() => '-',
            c => c,
        })
        .collect();
    let clean = clean.trim().trim_matches('.');
    format!("{}.{ext}", if clean.is_empty() { fallback } else { clean })
}

/// Writes a file the user chose so that a full disk never leaves half a file under that name:
/// into a neighbour first, then renamed over it.
async fn write_whole(path: &std::path::Path, text: String) -> Result<()> {
    let tmp = path.with_extension("rill-tmp");
    if let Err(e) = tokio::fs::write(&tmp, text).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e.into());
    }
    tokio::fs::rename(&tmp, path).await?;
    Ok(())
}

/// Exports a conversation (`json`: lossless, every branch; `markdown`: the current branch) to
/// where the user says. Returns the path written, `None` when the user cancelled.
#[tauri::command]
pub async fn export_conversation(
    app: AppHandle,
    state: State<'_, AppState>,
    id: i64,
    format: String,
) -> Result<Option<PathBuf>> {
    let (ext, filter) = match format.as_str() {
        "json" => (
            "json",
            Filter {
                name: "Rill conversation",
                extensions: &["json"],
            },
        ),
        "markdown" => (
            "md",
            Filter {
                name: "Markdown",
                extensions: &["md"],
            },
        ),
        other => {
            return Err(CommandError::Invalid(format!(
                "unknown export format `{other}`"
            )))
        }
    };
    let title = state.store.conversation(id).await?.title;
    let name = file_name(&title, "conversation", ext);
    let Some(path) = dialogs::save_file(&app, &name, filter).await? else {
        return Ok(None);
    };
    let text = match ext {
        "json" => state.store.export_json(id).await?,
        _ => state.store.export_markdown(id).await?,
    };
    write_whole(&path, text).await?;
    Ok(Some(path))
}

/// Imports a conversation from a JSON export the user picks. Returns its id, `None` when the
/// user cancelled.
#[tauri::command]
pub async fn import_conversation(
    app: AppHandle,
    state: State<'_, AppState>,
) -> Result<Option<i64>> {
    let filter = Filter {
        name: "Rill conversation",
        extensions: &["json"],
    };
    let Some(path) = dialogs::pick_file(&app, filter).await? else {
        return Ok(None);
    };
    let text = tokio::fs::read_to_string(&path).await?;
    Ok(Some(state.store.import_json(&text).await?))
}

/// Writes an answer, its settings and its token probabilities to a JSON file the user names.
#[tauri::command]
pub async fn export_answer(
    app: AppHandle,
    state: State<'_, AppState>,
    message: i64,
) -> Result<Option<PathBuf>> {
    let name = format!("answer-{message}-probabilities.json");
    let filter = Filter {
        name: "JSON",
        extensions: &["json"],
    };
    let Some(path) = dialogs::save_file(&app, &name, filter).await? else {
        return Ok(None);
    };
    let m = state.store.message(message).await?;
    let tokens = state.store.message_tokens(message).await?;
    let doc = serde_json::json!({
        "rill_answer": 1,
        "message": m,
        "question": match m.parent_id {
            Some(p) => Some(state.store.message(p).await?.content),
            None => None,
        },
        "tokens": tokens.unwrap_or(serde_json::Value::Array(Vec::new())),
    });
    write_whole(
        &path,
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )
    .await?;
    Ok(Some(path))
}

/// Opens a link from an answer in the system browser, after the user confirms the address.
/// Only http and https links; anything else is refused. Returns whether it was opened.
#[tauri::command]
pub async fn open_link(app: AppHandle, url: String) -> Result<bool> {
    let url = dialogs::web_link(&url)?;
    let question = format!("Open this link in your browser?\n\n{url}");
    if !dialogs::confirm(&app, question, "Open").await? {
        return Ok(false);
    }
    app.opener()
        .open_url(url.as_str(), None::<&str>)
        .map_err(|e| CommandError::Invalid(format!("could not open {url}: {e}")))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposed_file_names_are_plain_names() {
        assert_eq!(
            file_name("Paris / France?", "c", "md"),
            "Paris - France-.md"
        );
        assert_eq!(file_name("  ", "conversation", "json"), "conversation.json");
        assert_eq!(file_name("../..", "c", "json"), "-.json");
    }
}
