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

pub type Result<T, E = Error> = std::result::Result<T, E>;
