//! The models on this machine as the page may name them: a path the page sends is used only
//! when it is one of them (the models folder, imported files, the Hugging Face cache).

use std::path::PathBuf;

use rill_engine::hub;

use crate::error::{CommandError, Result};

/// Refuses a path that is not one of the models on this machine (`models`' list), so the
/// page can make the engine read no file but those (the model, a draft model).
pub(crate) async fn check_on_this_machine(dir: PathBuf, path: &std::path::Path) -> Result<()> {
    let wanted = path.to_path_buf();
    let known = blocking(move || {
        let same = |a: &std::path::Path| {
            a == wanted || a.canonicalize().ok() == wanted.canonicalize().ok()
        };
        hub::list(&dir).iter().any(|m| same(&m.info.path))
    })
    .await?;
    if !known {
        return Err(CommandError::Invalid(format!(
            "{} is not a model on this machine: import it first",
            path.display()
        )));
    }
    Ok(())
}

/// Runs `f` on a blocking thread (listing reads every file's header).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tauri::async_runtime::spawn_blocking(f)
        .await
        .map_err(|e| CommandError::Invalid(e.to_string()))
}
