//! The store's one error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file at the database path is not a SQLite database. It is left untouched.
    #[error("{}: not a Rill database (not a SQLite file); it was left untouched", path.display())]
    NotADatabase { path: PathBuf },

    /// The database was written by a newer Rill (it has migrations we do not know).
    #[error("{}: written by a newer version of Rill; update Rill to open it", path.display())]
    NewerSchema { path: PathBuf },

    #[error("conversation {0} not found")]
    ConversationNotFound(i64),

    #[error("message {0} not found")]
    MessageNotFound(i64),

    #[error("image {0} not found")]
    ImageNotFound(String),

    /// A second writer on one answer (issue 13): it is being written already, here or by
    /// another program, or it ended in a way that is not continued (done, error).
    #[error("{}", not_continuable(*id, *status))]
    NotContinuable { id: i64, status: crate::Status },

    /// An export file that cannot be imported; nothing was changed.
    #[error("cannot import: {0}")]
    Import(String),

    #[error("database: {0}")]
    Db(#[from] sqlx::Error),

    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn not_continuable(id: i64, status: crate::Status) -> String {
    match status {
        crate::Status::Streaming => format!("answer {id} is being written already"),
        other => format!(
            "answer {id} is {}: only a stopped or interrupted answer can be continued",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
