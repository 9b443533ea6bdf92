//! The engine's one error type. Every fallible function in this crate returns
//! [`Result`]; binaries wrap it in `anyhow`, servers map it to their wire shape once.

use std::path::PathBuf;

/// Everything that can go wrong between a model file and a stream of tokens.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file is missing, unreadable, not GGUF, truncated or inconsistent.
    #[error("model file {}: {message}", path.display())]
    ModelFile { path: PathBuf, message: String },

    /// The file is a valid GGUF of a model family this engine does not run.
    /// `what` says what the file holds, `families` what Rill runs (`model::family::unsupported`).
    #[error("unsupported architecture `{architecture}` ({what}): Rill runs {families}")]
    UnsupportedArchitecture {
        architecture: String,
        what: &'static str,
        families: String,
    },

    /// The tokenizer could not be built or could not encode the prompt.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),

    /// The chat template ran into a limit that keeps templates from taking the process down
    /// (fuel, depth, size) or crashed: a hostile or broken template, not a refusal.
    #[error("chat template: {0}")]
    TemplateLimit(String),

    /// A request or setting is out of range; `field` names it as the user wrote it.
    #[error("invalid {field}: {message}")]
    InvalidParam {
        field: &'static str,
        message: String,
    },

    /// A JSON schema or grammar that constrained decoding cannot use, or a matcher failure.
    #[error("grammar: {0}")]
    Grammar(String),

    /// An image that cannot be read (not an image, damaged, too large), or sent to a model
    /// that reads none; the text says which.
    #[error("image: {0}")]
    Image(String),

    /// The prompt does not fit the model's context window.
    #[error("prompt has {prompt_tokens} tokens but the context holds {context} (including room for at least one answer token)")]
    PromptTooLong {
        prompt_tokens: usize,
        context: usize,
    },

    /// The inference thread is gone (it stopped or panicked).
    #[error("the inference engine has stopped")]
    EngineStopped,

    /// A tensor operation failed inside candle.
    #[error("model computation failed: {}", candle_message(.0))]
    Candle(#[from] candle_core::Error),

    /// Downloading a model failed.
    #[error("download failed: {0}")]
    Download(String),

    /// The user cancelled a download; its partial file stays, and the next try resumes it.
    #[error("download cancelled")]
    DownloadCancelled,

    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Error {
    pub(crate) fn param(field: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidParam {
            field,
            message: message.into(),
        }
    }

    pub(crate) fn model_file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::ModelFile {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// What a caught panic said (its `&str` or `String` payload), for the error that reports it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// A candle error as one line: without the backtrace candle attaches when `RUST_BACKTRACE` is
/// set, which would otherwise end up in front of the user.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_message(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_message(inner)),
        other => other
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
