//! The one error every command returns, mapped once at the boundary: the page gets
//! `{ kind, message }`, with `kind` a stable name it can branch on.

use serde::ser::SerializeStruct;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("no model is loaded: download one or import a GGUF file")]
    NoModel,
    #[error("this answer is not running any more")]
    NotRunning,
    #[error(transparent)]
    Engine(#[from] rill_engine::Error),
    #[error(transparent)]
    Store(#[from] rill_store::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

impl From<rill_chat::Error> for CommandError {
    fn from(e: rill_chat::Error) -> Self {
        match e {
            rill_chat::Error::Engine(e) => CommandError::Engine(e),
            rill_chat::Error::Store(e) => CommandError::Store(e),
            rill_chat::Error::Generation(m) => CommandError::Invalid(m),
        }
    }
}

impl CommandError {
    fn kind(&self) -> &'static str {
        match self {
            CommandError::NoModel => "no_model",
            CommandError::NotRunning => "not_running",
            CommandError::Engine(rill_engine::Error::InvalidParam { .. }) => "invalid_param",
            CommandError::Engine(rill_engine::Error::PromptTooLong { .. }) => "prompt_too_long",
            CommandError::Engine(rill_engine::Error::Image(_)) => "image",
            CommandError::Engine(rill_engine::Error::DownloadCancelled) => "cancelled",
            CommandError::Engine(_) => "engine",
            CommandError::Store(_) => "store",
            CommandError::Io(_) => "io",
            CommandError::Invalid(_) => "invalid",
        }
    }
}

impl serde::Serialize for CommandError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("CommandError", 2)?;
        st.serialize_field("kind", self.kind())?;
        st.serialize_field("message", &self.to_string())?;
        st.end()
    }
}

pub type Result<T, E = CommandError> = std::result::Result<T, E>;
