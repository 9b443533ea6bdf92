//! How a chat template lets its model think, read by rendering it (under the template limits):
//! what the window's Think switch and thinking budget apply to.

use serde::Serialize;

use super::{ChatTemplate, Message, RenderOptions};

/// How a chat template lets its model think: what the window's Think switch and thinking
/// budget apply to, and whether a request that says nothing gets thinking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Thinking {
    /// No thinking block.
    #[default]
    None,
    /// The template reads `enable_thinking` and thinks unless it is false (Qwen3).
    Optional,
    /// The template reads `enable_thinking` and thinks only when it is true (llama.cpp's
    /// DeepSeek-R1-Distill template closes the block it opens otherwise).
    OnRequest,
    /// The model thinks whenever it answers, with no switch: in a `<think>` block (QwQ, the
    /// official DeepSeek-R1 distills' templates), or in harmony's analysis message (gpt-oss,
    /// whose reasoning effort is low, medium or high, never none).
    Always,
}

impl Thinking {
    /// Whether an answer thinks, given the request's `enable_thinking` (if it set one).
    pub fn on(self, enable_thinking: Option<bool>) -> bool {
        match self {
            Thinking::None => false,
            Thinking::Always => true,
            Thinking::Optional => enable_thinking != Some(false),
            Thinking::OnRequest => enable_thinking == Some(true),
        }
    }
}

impl ChatTemplate {
    /// How the template thinks, read by rendering a question with `enable_thinking` unset, on
    /// and off: a template that ignores it and knows `<think>` always thinks, as does
    /// harmony's (its analysis channel).
    pub fn thinking(&self) -> Thinking {
        use crate::reasoning::{CLOSE, OPEN};
        if crate::tools::ToolFormat::of(&self.source) == crate::tools::ToolFormat::Harmony
            && self.source.contains("analysis")
        {
            return Thinking::Always;
        }
        if !self.source.contains(OPEN) && !self.source.contains(CLOSE) {
            return Thinking::None;
        }
        let render = |enable_thinking| {
            let options = RenderOptions {
                add_generation_prompt: true,
                enable_thinking,
                ..Default::default()
            };
            self.render_with(&[Message::user("2 + 2?")], &options).ok()
        };
        let (unset, on, off) = (render(None), render(Some(true)), render(Some(false)));
        match (unset.is_some() && unset == on, unset == off) {
            (true, true) => Thinking::Always,
            (true, false) => Thinking::Optional,
            (false, true) if on.is_some() => Thinking::OnRequest,
            _ => Thinking::None,
        }
    }
}
