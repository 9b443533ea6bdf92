//! OpenAI's wire types, and their one conversion into engine types ("parse, don't validate":
//! after [`Sampling::into_generate`], nothing downstream checks a field again).

use rill_engine::{
    GenerateRequest, Grammar, Message, Prompt, Role, SamplingParams, Speculation, StopReason,
    ToolCall,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;

/// `content` is a string or a list of parts: text, and images (`image_url`, a data: URL).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub image_url: Option<ImageUrl>,
}

/// An `image_url` part's image: `{"url": "data:image/png;base64,…"}`; OpenAI's `detail` is
/// accepted and has no effect (the projector decides the resolution).
#[derive(Debug, Deserialize)]
pub struct ImageUrl {
    pub url: String,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// The calls an assistant message made.
    #[serde(default)]
    pub tool_calls: Vec<WireToolCall>,
    /// A `tool` message's answer to a call.
    pub tool_call_id: Option<String>,
}

/// A call as OpenAI writes it: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Deserialize)]
pub struct WireToolCall {
    pub id: Option<String>,
    pub function: WireFunction,
}

#[derive(Debug, Deserialize)]
pub struct WireFunction {
    pub name: String,
    /// JSON text, as OpenAI sends it (some clients send the object itself).
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `logprobs` as either endpoint sends it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Logprobs {
    Flag(bool),
    Count(i64),
}

/// The most alternatives the legacy completions give a token (OpenAI's limit).
pub const MAX_LEGACY_LOGPROBS: i64 = 5;

/// The sampling fields shared by both completion endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub stop: Option<Stop>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub n: Option<u32>,
    /// `true`/`false` on chat completions; a count of alternatives (0–5) on the legacy
    /// completions, as OpenAI's two endpoints take it.
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": …}}`.
    pub response_format: Option<Value>,
    /// Rill's extension: a grammar in Lark (llguidance's syntax) the answer must match.
    pub grammar: Option<String>,
    /// Rill's extension: close a thinking model's `<think>` block after this many tokens.
    pub thinking_budget: Option<usize>,
    /// Rill's extension: speculative decoding, `"lookup"`, `"draft"` (the server's draft
    /// model, `rill serve --draft-model`) or `"off"` (the server's default otherwise).
    pub speculation: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub tools: crate::tools::ToolFields,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: String,
    #[serde(flatten)]
    pub sampling: Sampling,
}

impl Sampling {
    /// Whether to stream, and whether to end the stream with a usage chunk.
    pub fn streaming(&self) -> (bool, bool) {
        (
            self.stream,
            self.stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        )
    }

    /// `Some(top_logprobs)` when the client asked for token log-probabilities (OpenAI allows
    /// 0–20 alternatives, and `top_logprobs` only with `logprobs: true`).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = self.top_logprobs.unwrap_or(0);
        if top > 20 {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("at most 20, got {top}"),
            ));
        }
        match self.logprobs {
            Some(Logprobs::Flag(true)) => Ok(Some(top as usize)),
            Some(Logprobs::Count(_)) => Err(ApiError::invalid(
                "logprobs",
                "on chat completions `logprobs` is true or false (`top_logprobs` counts \
                 alternatives)",
            )),
            _ if top > 0 => Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs \"logprobs\": true",
            )),
            _ => Ok(None),
        }
    }

    /// The legacy completions' `logprobs`: `Some(n)` alternatives per token (0–5) when the
    /// client asked for log-probabilities, as OpenAI's integer.
    pub fn legacy_logprobs(&self) -> Result<Option<usize>, ApiError> {
        if self.top_logprobs.is_some() {
            return Err(ApiError::invalid(
                "top_logprobs",
                "the legacy completions count alternatives in `logprobs` (0–5)",
            ));
        }
        match self.logprobs {
            None | Some(Logprobs::Flag(false)) => Ok(None),
            Some(Logprobs::Count(n)) if (0..=MAX_LEGACY_LOGPROBS).contains(&n) => {
                Ok(Some(n as usize))
            }
            Some(other) => Err(ApiError::invalid(
                "logprobs",
                format!(
                    "an integer from 0 to {MAX_LEGACY_LOGPROBS} on /v1/completions, got {}",
                    match other {
                        Logprobs::Count(n) => n.to_string(),
                        Logprobs::Flag(b) => b.to_string(),
                    }
                ),
            )),
        }
    }

    /// Checks what the engine cannot express and builds the request around `prompt`; fields the
    /// client leaves out take the server's `defaults`.
    pub fn into_generate(
        self,
        prompt: Prompt,
        defaults: &SamplingParams,
        speculation: Speculation,
        logprobs: Option<usize>,
    ) -> Result<GenerateRequest, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::invalid(
                "n",
                format!("only n = 1 is supported, got {n}"),
            ));
        }
        let top_candidates = match logprobs {
            // The drawn token's own probability needs one candidate; `top_logprobs` more.
            Some(n) => n.max(1),
            None => 0,
        };
        let d = defaults;
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repetition_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed: self.seed.or(d.seed),
            ..d.clone()
        };
        params.validate().map_err(ApiError::from)?;
        let speculation = match self.speculation.as_deref() {
            None => speculation,
            Some("off") => Speculation::Off,
            Some("lookup") => Speculation::Lookup,
            // Refused by the engine with a 400 when the server has no draft model.
            Some("draft") => Speculation::Draft,
            Some(other) => {
                return Err(ApiError::invalid(
                    "speculation",
                    format!(
                    "`{other}` is not a kind of speculation: say \"lookup\", \"draft\" or \"off\""
                ),
                ))
            }
        };
        let grammar = self.grammar()?;
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) if v.len() > 4 => {
                return Err(ApiError::invalid("stop", "at most 4 stop sequences"))
            }
            Some(Stop::Many(v)) => v,
        };
        Ok(GenerateRequest {
            params,
            stop,
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            top_candidates,
            grammar,
            thinking_budget: self.thinking_budget,
            speculation,
            ..GenerateRequest::new(prompt)
        })
    }

    /// The grammar asked for by `response_format` or `grammar` (not both).
    fn grammar(&self) -> Result<Option<Grammar>, ApiError> {
        let format = match &self.response_format {
            None => None,
            Some(f) => response_format(f)?,
        };
        match (format, &self.grammar) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "grammar",
                "give either `response_format` or `grammar`, not both",
            )),
            (Some(g), None) => Ok(Some(g)),
            (None, Some(lark)) => Ok(Some(Grammar::Lark(lark.clone()))),
            (None, None) => Ok(None),
        }
    }
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object` or `json_schema`.
fn response_format(f: &Value) -> Result<Option<Grammar>, ApiError> {
    let bad = |m: &str| ApiError::invalid("response_format", m.to_string());
    let kind = f
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("needs a string `type`: text, json_object or json_schema"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonObject)),
        "json_schema" => {
            let spec = f
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("type json_schema needs a `json_schema` object"))?;
            // OpenAI makes `schema` optional; without one, any JSON value will do.
            let schema = spec
                .get("schema")
                .cloned()
                .unwrap_or(Value::Object(Default::default()));
            if !schema.is_object() {
                return Err(bad("`json_schema.schema` must be a JSON object"));
            }
            Ok(Some(Grammar::JsonSchema(schema)))
        }
        other => Err(bad(&format!(
            "unknown type `{other}` (text, json_object or json_schema)"
        ))),
    }
}

/// The request field a grammar came from, to name in an error about it.
pub fn grammar_field(g: &Grammar) -> &'static str {
    match g {
        Grammar::Lark(_) => "grammar",
        Grammar::ToolCalls(_) => "tool_choice",
        Grammar::JsonSchema(_) | Grammar::JsonObject => "response_format",
    }
}

impl ChatCompletionRequest {
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "at least one message is needed",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "tool" => Role::Tool,
                    other => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].role"),
                            format!("unknown role `{other}`"),
                        ))
                    }
                };
                let mut images = Vec::new();
                let content = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for (j, p) in parts.iter().enumerate() {
                            match (p.kind.as_str(), &p.text, &p.image_url) {
                                ("text", Some(t), _) => text.push_str(t),
                                ("image_url", _, Some(url)) => images.push(
                                    rill_engine::ImageData::from_url(&url.url).map_err(|e| {
                                        ApiError::invalid(
                                            format!("messages[{i}].content[{j}].image_url"),
                                            e,
                                        )
                                    })?,
                                ),
                                (kind, _, _) => {
                                    return Err(ApiError::invalid(
                                        format!("messages[{i}].content[{j}]"),
                                        format!(
                                            "content part `{kind}` is not supported (text and \
                                             image_url)"
                                        ),
                                    ));
                                }
                            }
                        }
                        text
                    }
                };
                if !images.is_empty() && role != Role::User {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        "only user messages carry images",
                    ));
                }
                let mut message = Message::new(role, content);
                message.images = images;
                if role == Role::Tool {
                    let id = m.tool_call_id.clone().ok_or_else(|| {
                        ApiError::invalid(
                            format!("messages[{i}].tool_call_id"),
                            "a tool message needs the `tool_call_id` it answers",
                        )
                    })?;
                    message.tool_call_id = Some(id);
                }
                if !m.tool_calls.is_empty() && role != Role::Assistant {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].tool_calls"),
                        "only assistant messages carry tool calls",
                    ));
                }
                message.tool_calls =
                    m.tool_calls
                        .iter()
                        .enumerate()
                        .map(|(j, c)| ToolCall {
                            id: c.id.clone().unwrap_or_else(|| {
                                rill_engine::tools::call_id((i * 64 + j) as u64)
                            }),
                            name: c.function.name.clone(),
                            arguments: match &c.function.arguments {
                                Value::String(s) => s.clone(),
                                Value::Null => "{}".to_owned(),
                                other => other.to_string(),
                            },
                        })
                        .collect();
                Ok(message)
            })
            .collect()
    }
}

/// OpenAI's defaults: temperature 1, top-p 1, no top-k, min-p or penalties.
pub fn openai_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        min_p: 0.0,
        ..SamplingParams::default()
    }
}

/// OpenAI's `finish_reason` for an engine stop.
pub fn finish_reason(r: StopReason) -> &'static str {
    // An answer that called tools says `tool_calls` instead (reply.rs).
    match r {
        StopReason::Stop | StopReason::StopString | StopReason::Cancelled => "stop",
        StopReason::Length | StopReason::ContextFull => "length",
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// OpenAI's breakdown: how many answer tokens were reasoning (only when some were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CompletionDetails {
    pub reasoning_tokens: usize,
    /// Speculative decoding's draft tokens that the model drew, and those it did not (OpenAI's
    /// names for predicted outputs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accepted_prediction_tokens: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected_prediction_tokens: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl From<rill_engine::Usage> for Usage {
    fn from(u: rill_engine::Usage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            completion_tokens_details: (u.reasoning_tokens > 0 || u.draft_proposed > 0).then_some(
                CompletionDetails {
                    reasoning_tokens: u.reasoning_tokens,
                    accepted_prediction_tokens: u.draft_accepted,
                    rejected_prediction_tokens: u.draft_proposed - u.draft_accepted,
                },
            ),
        }
    }
}
