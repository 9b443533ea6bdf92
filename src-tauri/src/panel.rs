//! The sampling panel's settings for a conversation: the engine's parameters, the answer's
//! length cap, token probabilities, the backend, and what an answer is made of (a thinking
//! model's switch and budget, a JSON schema). Stored per conversation as JSON, and turned here
//! into [`rill_chat::AnswerOptions`].

use rill_engine::{Grammar, SamplingParams, Speculation};
use serde::{Deserialize, Serialize};

use crate::error::{CommandError, Result};

/// The sampling panel: the engine's parameters plus the answer-length cap. Stored per
/// conversation (and as the default for new ones).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelSettings {
    #[serde(flatten)]
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    /// Keep every answer token's likeliest candidates (for the probability popover, the
    /// tinting and the export). Costs about 4% of decode speed; on unless switched off.
    #[serde(default = "yes")]
    pub token_probs: bool,
    /// Answer with a remote OpenAI-compatible server instead of this machine's engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteBackend>,
    /// The Think switch, for a model whose template reads `enable_thinking` (Qwen3); `None`
    /// leaves the template's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub think: Option<bool>,
    /// Close a thinking model's block after this many tokens of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<usize>,
    /// Structured output: every answer is JSON that this schema accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<serde_json::Value>,
    /// "Speed up": speculative decoding (off, prompt lookup, or a draft model).
    #[serde(default)]
    pub speed_up: Speculation,
    /// With `speed_up` "draft": the draft model's file, from the models list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
}

fn yes() -> bool {
    true
}

/// Candidates kept per token when the panel asks for token probabilities.
const TOKEN_CANDIDATES: usize = 8;

impl Default for PanelSettings {
    fn default() -> Self {
        PanelSettings {
            params: SamplingParams::default(),
            max_tokens: None,
            token_probs: true,
            remote: None,
            think: None,
            thinking_budget: None,
            json_schema: None,
            speed_up: Speculation::Off,
            draft_model: None,
        }
    }
}

impl PanelSettings {
    pub fn from_json(v: &serde_json::Value) -> Self {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn options(&self) -> rill_chat::AnswerOptions {
        let mut chat = rill_engine::ChatArgs::default();
        if let Some(think) = self.think {
            chat.kwargs.insert("enable_thinking".into(), think.into());
        }
        rill_chat::AnswerOptions {
            params: self.params.clone(),
            stop: Vec::new(),
            max_tokens: self.max_tokens,
            top_candidates: if self.token_probs {
                TOKEN_CANDIDATES
            } else {
                0
            },
            chat,
            thinking_budget: self.thinking_budget,
            grammar: self.json_schema.clone().map(Grammar::JsonSchema),
            speculation: self.speed_up,
        }
    }

    /// Before an answer drafts with a model: makes the chosen file the engine's draft model,
    /// loading it (off the async runtime) unless it is already. A file that is not one of the
    /// models on this machine (`models_dir`'s list), or of another vocabulary, is refused with
    /// the reason, and nothing is written.
    pub async fn ensure_draft(
        &self,
        handle: &rill_engine::Handle,
        models_dir: &std::path::Path,
    ) -> Result<()> {
        if self.speed_up != Speculation::Draft {
            return Ok(());
        }
        let Some(path) = self.draft_model.clone() else {
            return Err(CommandError::Invalid(
                "Speed up: choose the draft model".into(),
            ));
        };
        let path = std::path::PathBuf::from(path);
        if handle.draft_model().is_some_and(|d| d.path == path) {
            return Ok(());
        }
        crate::local_models::check_on_this_machine(models_dir.to_path_buf(), &path).await?;
        let handle = handle.clone();
        tauri::async_runtime::spawn_blocking(move || handle.set_draft_model(Some(&path)))
            .await
            .map_err(|e| CommandError::Invalid(format!("loading the draft model: {e}")))?
            .map_err(|e| CommandError::Invalid(format!("the draft model: {e}")))?;
        Ok(())
    }

    /// Checks what the engine cannot take from the page as it is: a thinking budget of 0, a
    /// schema llguidance refuses (named in the error).
    pub fn check(&self, handle: Option<&rill_engine::Handle>) -> Result<()> {
        if self.thinking_budget == Some(0) {
            return Err(CommandError::Invalid(
                "the thinking budget must be at least 1 token".into(),
            ));
        }
        if let Some(schema) = &self.json_schema {
            if !schema.is_object() {
                return Err(CommandError::Invalid(
                    "the structured output's schema must be a JSON object".into(),
                ));
            }
            if let Some(handle) = handle {
                handle
                    .check_grammar(&Grammar::JsonSchema(schema.clone()))
                    .map_err(|e| CommandError::Invalid(format!("the JSON schema: {e}")))?;
            }
        }
        Ok(())
    }
}

/// Where a conversation's answers come from when not from this machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteBackend {
    /// The server's address, e.g. `http://gpu-box:8000` (with or without `/v1`).
    pub url: String,
    /// The model name the server knows.
    pub model: String,
    /// Only on the way in, from the page: a key to keep for this server (`""` forgets the kept
    /// one). It is never written into the conversation's settings nor sent back to the page: it
    /// lives in the secrets file (`secrets.rs`) and is filled in here only to make a request.
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// Whether a key is kept for this server (what the page shows instead of the key).
    #[serde(default)]
    pub has_key: bool,
}

impl RemoteBackend {
    pub fn validate(&self) -> Result<()> {
        let url = self.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(CommandError::Invalid(format!(
                "the remote server's address must start with http:// or https:// (got `{url}`)"
            )));
        }
        if self.model.trim().is_empty() {
            return Err(CommandError::Invalid(
                "name the model to use on the remote server".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panel_settings_round_trip_through_the_stored_json() {
        let s = PanelSettings {
            params: SamplingParams {
                temperature: 0.2,
                top_p: 0.5,
                seed: Some(7),
                ..Default::default()
            },
            max_tokens: Some(64),
            token_probs: false,
            remote: None,
            think: Some(false),
            thinking_budget: Some(16),
            json_schema: Some(serde_json::json!({"type": "object"})),
            speed_up: Speculation::Lookup,
            draft_model: None,
        };
        assert_eq!(PanelSettings::from_json(&s.to_json()), s);
        let drafting = PanelSettings {
            speed_up: Speculation::Draft,
            draft_model: Some("/models/SmolLM2-135M-Instruct.Q4_1.gguf".into()),
            ..s
        };
        assert_eq!(PanelSettings::from_json(&drafting.to_json()), drafting);
        // The test-only proposer cannot come from the page.
        assert!(serde_json::from_value::<PanelSettings>(
            serde_json::json!({"speed_up": "contrary"})
        )
        .is_err());
        // Token probabilities are kept unless switched off, also for settings saved before
        // the switch existed.
        assert!(PanelSettings::from_json(&serde_json::json!({"temperature": 0.3})).token_probs);
        // Settings stored by an older Rill, or none at all, give the defaults.
        assert_eq!(
            PanelSettings::from_json(&serde_json::json!({})),
            PanelSettings::default()
        );
    }
}
