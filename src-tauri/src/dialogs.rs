//! The native dialogs, opened from the Rust side: the page never names a file.
//!
//! Export, import and a model file's import each ask the user here, and the command acts only
//! on the path the dialog returned, so a script in the page (model output is untrusted) cannot
//! make the app read or write a file of its choosing (issue 13). A link in an answer opens in
//! the system browser only after a confirmation that names it.
//!
//! Tests answer the dialogs without a display of their own: in a debug build (`make test`
//! builds one), when `RILL_TEST_DIALOG` names a file, each dialog takes its answer from that
//! file instead of asking (its first line: the path chosen, or `cancel`; for a confirmation,
//! `yes` or `no`) and deletes it; no file means cancel. A release build has no such door.

use std::path::PathBuf;

use tauri::{AppHandle, Url};
use tauri_plugin_dialog::{DialogExt, MessageDialogButtons, MessageDialogKind};
use tokio::sync::oneshot;

use crate::error::{CommandError, Result};

/// A file type offered in a dialog: its name and extensions.
pub struct Filter {
    pub name: &'static str,
    pub extensions: &'static [&'static str],
}

/// A test's answer to the next dialog (debug builds only), or `None` to ask the user. With
/// `RILL_TEST_DIALOG` set and no answer waiting, the dialog is cancelled: a test never hangs on
/// a dialog nobody can see.
#[cfg(debug_assertions)]
fn test_answer() -> Option<String> {
    let file = std::env::var_os("RILL_TEST_DIALOG")?;
    let answer = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    Some(answer.lines().next().unwrap_or("").trim().to_owned())
}

#[cfg(not(debug_assertions))]
fn test_answer() -> Option<String> {
    None
}

fn answered_path() -> Option<Option<PathBuf>> {
    test_answer().map(|a| match a.as_str() {
        "" | "cancel" => None,
        path => Some(PathBuf::from(path)),
    })
}

async fn wait<T: Send + 'static>(ask: impl FnOnce(oneshot::Sender<T>)) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    ask(tx);
    rx.await
        .map_err(|_| CommandError::Invalid("the dialog closed without an answer".into()))
}

fn into_path(p: Option<tauri_plugin_dialog::FilePath>) -> Option<PathBuf> {
    p.and_then(|p| p.into_path().ok())
}

/// Asks where to save; `None` when the user cancels.
pub async fn save_file(app: &AppHandle, name: &str, filter: Filter) -> Result<Option<PathBuf>> {
    if let Some(answer) = answered_path() {
        return Ok(answer);
    }
    let builder = app
        .dialog()
        .file()
        .set_file_name(name)
        .add_filter(filter.name, filter.extensions);
    wait(|tx| {
        builder.save_file(move |p| {
            let _ = tx.send(into_path(p));
        })
    })
    .await
}

/// Asks for a file to open; `None` when the user cancels.
pub async fn pick_file(app: &AppHandle, filter: Filter) -> Result<Option<PathBuf>> {
    if let Some(answer) = answered_path() {
        return Ok(answer);
    }
    let builder = app
        .dialog()
        .file()
        .add_filter(filter.name, filter.extensions);
    wait(|tx| {
        builder.pick_file(move |p| {
            let _ = tx.send(into_path(p));
        })
    })
    .await
}

/// Asks to confirm `message` with a button labelled `ok`.
pub async fn confirm(app: &AppHandle, message: String, ok: &str) -> Result<bool> {
    if let Some(answer) = test_answer() {
        return Ok(answer == "yes");
    }
    let builder = app
        .dialog()
        .message(message)
        .title("Rill")
        .kind(MessageDialogKind::Warning)
        .buttons(MessageDialogButtons::OkCancelCustom(
            ok.into(),
            "Cancel".into(),
        ));
    wait(|tx| {
        builder.show(move |yes| {
            let _ = tx.send(yes);
        })
    })
    .await
}

/// The address of a link in an answer, if it is one the system browser may open: http(s) with
/// a host. Anything else (`javascript:`, `file:`, `data:`, an app scheme) stays inert.
pub fn web_link(href: &str) -> Result<Url> {
    let url = Url::parse(href.trim())
        .map_err(|_| CommandError::Invalid(format!("`{href}` is not a web address")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(CommandError::Invalid(format!(
            "only http and https links open outside the app, not `{href}`"
        )));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_web_links_open_outside_the_app() {
        for ok in [
            "https://example.com/a?b=c#d",
            "http://127.0.0.1:8080/",
            " https://x.org ",
        ] {
            assert!(web_link(ok).is_ok(), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            "JAVASCRIPT:alert(1)",
            "file:///etc/passwd",
            "data:text/html,<script>x</script>",
            "tauri://localhost",
            "mailto:a@b.c",
            "https://",
            "/relative",
            "",
        ] {
            assert!(web_link(bad).is_err(), "{bad}");
        }
    }
}
