//! OpenAI's tool fields on the way in: `tools`, `tool_choice`, `parallel_tool_calls`, and the
//! template fields `chat_template_kwargs` and `reasoning_effort`, checked once and turned into
//! what the engine takes ([`ChatArgs`], and a [`Grammar`] when the client insists on a call);
//! and on the way out, the answer read back into `tool_calls` ([`Reader`]).

use rill_engine::tools::{call_id, prompt, Calls, Piece, ToolFormat, ToolStream};
use rill_engine::{ChatArgs, Grammar};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// The request's fields about tools and the template.
#[derive(Debug, Default, Deserialize)]
pub struct ToolFields {
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Variables for the chat template (`{"enable_thinking": false}`, …).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// gpt-oss's effort (`low`, `medium`, `high`); for templates with `enable_thinking`,
    /// `none` turns thinking off and any other value on.
    pub reasoning_effort: Option<String>,
}

/// What the client allows the model to do with its tools.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// No tools offered, or `"none"`: the answer is text.
    None,
    /// `"auto"`: the model decides.
    Auto,
    /// `"required"`: at least one call.
    Required,
    /// One call of this function.
    Named(String),
}

/// The checked tool fields.
pub struct Tools {
    pub args: ChatArgs,
    pub choice: Choice,
    /// Each tool's name and parameter schema.
    signatures: Vec<(String, Value)>,
    parallel: bool,
}

impl ToolFields {
    pub fn check(&self) -> Result<Tools, ApiError> {
        let tools = self.tools.clone().unwrap_or_default();
        let mut signatures = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let bad = |m: &str| ApiError::invalid(format!("tools[{i}]"), m.to_string());
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad("only tools of `type: \"function\"` are supported"));
            }
            let Some((name, params)) = prompt::signature(t) else {
                return Err(bad("needs `function.name`, a string"));
            };
            if !params.is_object() {
                return Err(bad("`function.parameters` must be a JSON schema object"));
            }
            if signatures.iter().any(|(n, _)| n == name) {
                return Err(bad(&format!("a second tool named `{name}`")));
            }
            signatures.push((name.to_owned(), params));
        }
        let bad = |m: String| ApiError::invalid("tool_choice", m);
        let choice = match &self.tool_choice {
            None if tools.is_empty() => Choice::None,
            None => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => Choice::None,
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                other => {
                    return Err(bad(format!(
                        "unknown `{other}` (none, auto, required, or a function)"
                    )))
                }
            },
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        bad("a named choice is {\"type\": \"function\", \"function\": {\"name\": …}}".into())
                    })?;
                Choice::Named(name.to_owned())
            }
        };
        match &choice {
            Choice::Required | Choice::Named(_) if tools.is_empty() => {
                return Err(bad("asks for a tool call, but `tools` is empty".into()))
            }
            Choice::Named(n) if !signatures.iter().any(|(s, _)| s == n) => {
                return Err(bad(format!("names `{n}`, which is not among `tools`")))
            }
            _ => {}
        }
        let mut kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &self.reasoning_effort {
            if !["none", "minimal", "low", "medium", "high"].contains(&effort.as_str()) {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!("unknown `{effort}` (none, minimal, low, medium or high)"),
                ));
            }
            kwargs
                .entry("enable_thinking")
                .or_insert(Value::Bool(effort != "none"));
            if effort != "none" {
                kwargs
                    .entry("reasoning_effort")
                    .or_insert(Value::String(effort.clone()));
            }
        }
        let offered = if choice == Choice::None {
            Vec::new()
        } else {
            tools
        };
        Ok(Tools {
            args: ChatArgs {
                tools: offered,
                kwargs,
            },
            choice,
            signatures,
            parallel: self.parallel_tool_calls.unwrap_or(true),
        })
    }
}

impl Tools {
    /// The grammar that makes the model call when the client insists (`required`, a named
    /// function), in the model's own call format.
    pub fn grammar(&self, handle: &rill_engine::Handle) -> Result<Option<Grammar>, ApiError> {
        let (tools, parallel): (Vec<(String, Value)>, bool) = match &self.choice {
            Choice::None | Choice::Auto => return Ok(None),
            Choice::Required => (self.signatures.clone(), self.parallel),
            Choice::Named(n) => (
                self.signatures
                    .iter()
                    .filter(|(s, _)| s == n)
                    .cloned()
                    .collect(),
                false,
            ),
        };
        handle
            .tool_grammar(&tools, parallel)
            .map(|g| Some(Grammar::ToolCalls(g)))
            .ok_or_else(|| {
                let format = handle.tool_format();
                ApiError::invalid(
                    "tool_choice",
                    format!("this model's tool format ({format:?}) cannot be forced to call yet; use `auto`"),
                )
            })
    }

    /// Whether the answer is read for calls.
    pub fn parse(&self) -> bool {
        self.choice != Choice::None
    }
}

/// What one step of an answer adds, in the API's terms.
#[derive(Debug, Default, PartialEq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    /// `delta.tool_calls` entries: a call's start (id, name) or more of its arguments.
    pub calls: Vec<Value>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

/// Reads an answer's text for tool calls as it streams (when the request offered tools), and
/// gathers the whole answer from the same pieces, so streamed and whole answers agree.
pub struct Reader {
    stream: Option<ToolStream>,
    seed: u64,
    gathered: Calls,
    ids: Vec<String>,
}

impl Reader {
    /// `format`: how the model writes calls, or `None` to take the text as content.
    /// `seed` makes the calls' ids.
    pub fn new(format: Option<ToolFormat>, seed: u64) -> Self {
        Reader {
            stream: format.map(ToolStream::new),
            seed,
            gathered: Calls::default(),
            ids: Vec::new(),
        }
    }

    /// The engine's next text and reasoning.
    pub fn read(&mut self, text: &str, reasoning: &str) -> Delta {
        let pieces = match &mut self.stream {
            Some(s) => s.push(text),
            None => vec![Piece::Content(text.to_owned())],
        };
        let mut d = self.delta(pieces);
        d.reasoning.insert_str(0, reasoning);
        self.gathered.reasoning.push_str(reasoning);
        d
    }

    /// What the parser held back, at the answer's end.
    pub fn finish(&mut self) -> Delta {
        let pieces = self
            .stream
            .as_mut()
            .map(ToolStream::finish)
            .unwrap_or_default();
        self.delta(pieces)
    }

    fn delta(&mut self, pieces: Vec<Piece>) -> Delta {
        let mut d = Delta::default();
        for p in &pieces {
            self.gathered.add(p);
            match p {
                Piece::Content(t) => d.content.push_str(t),
                Piece::Reasoning(t) => d.reasoning.push_str(t),
                Piece::CallStart { index, name } => {
                    let id = call_id(self.seed.wrapping_add(*index as u64));
                    self.ids.push(id.clone());
                    d.calls
                        .push(json!({"index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""}}));
                }
                Piece::Arguments { index, text } => {
                    d.calls
                        .push(json!({"index": index, "function": {"arguments": text}}));
                }
            }
        }
        d
    }

    /// The whole answer: content, reasoning, and `message.tool_calls`.
    pub fn whole(&self) -> (&str, &str, Vec<Value>) {
        let calls = self
            .gathered
            .calls
            .iter()
            .zip(&self.ids)
            .map(|(c, id)| {
                json!({"id": id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        (&self.gathered.content, &self.gathered.reasoning, calls)
    }

    /// When the model called tools: the answer's content besides them, and the calls with
    /// their ids, as the engine and the store take them.
    pub fn called_with(&self) -> Option<(String, Vec<rill_engine::ToolCall>)> {
        if !self.called() {
            return None;
        }
        let calls = self
            .gathered
            .calls
            .iter()
            .zip(&self.ids)
            .map(|(c, id)| rill_engine::ToolCall {
                id: id.clone(),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        Some((self.gathered.content.clone(), calls))
    }

    /// Whether the model called a tool.
    pub fn called(&self) -> bool {
        !self.gathered.calls.is_empty()
    }
}
