//! Chat templates: from a list of messages to the exact prompt text the model was trained on.
//!
//! Models ship their template as Jinja in `tokenizer.chat_template` (GGUF) or in
//! `tokenizer_config.json`. We render it with minijinja, configured like Hugging Face's
//! `apply_chat_template` (trim_blocks, lstrip_blocks, Python string methods through
//! minijinja-contrib's pycompat) with the globals HF templates use: `bos_token`, `eos_token`,
//! `add_generation_prompt`, `enable_thinking`, `tools`, `raise_exception`, `strftime_now` and a
//! `tojson` that writes JSON as Python's `json.dumps` does (`json.rs`), plus whatever
//! the caller adds (OpenAI's `chat_template_kwargs`). Messages reach a template as Hugging
//! Face's give them: tool calls as `{"id", "type": "function", "function": {"name",
//! "arguments"}}` with the arguments as a JSON object (templates write them with `tojson`), a
//! tool result's `tool_call_id`, and no `tool_calls` key at all on a message without calls
//! (templates test `'tool_calls' in message`). Every template in
//! llama.cpp's folder renders byte for byte as Python's jinja2 renders it, for a fixed set of
//! conversations (tested). A template that cannot render is an error naming its line, never a
//! silent fallback. A file without a template gets ChatML, which most small instruct models
//! understand. A template is code from an untrusted file: every render runs under the limits of
//! [`limits`] (fuel, depth, size, a thread of its own), so a hostile one is an error, never a
//! crash or a hang.

mod caps;
mod json;
pub(crate) mod limits;
mod thinking;

pub use caps::fold_system;
pub use thinking::Thinking;

use crate::error::{Error, Result};
pub use crate::message::{Message, Role, ToolCall};

/// A message as a template reads it (see the module's docs).
fn template_view(m: &Message) -> serde_json::Value {
    let mut v = serde_json::json!({ "role": m.role.as_str(), "content": m.content });
    if !m.tool_calls.is_empty() {
        let calls: Vec<serde_json::Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                // Arguments that are not JSON (a client's mistake) stay the text they are.
                let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
                serde_json::json!({
                    "id": c.id, "type": "function",
                    "function": { "name": c.name, "arguments": arguments },
                })
            })
            .collect();
        v["tool_calls"] = calls.into();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = id.clone().into();
    }
    if let Some(r) = m.reasoning.as_ref().filter(|r| !r.is_empty()) {
        v["reasoning_content"] = r.clone().into();
        v["thinking"] = r.clone().into();
    }
    v
}

/// ChatML, for models that carry no template of their own.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether it renders a system message (`caps.rs`), read on first use.
    system_role: std::sync::OnceLock<bool>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// How to render beyond the messages: the variables templates read besides them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderOptions {
    /// End with the assistant's opening (the model answers next).
    pub add_generation_prompt: bool,
    /// `enable_thinking`, for templates that read it (Qwen3, …); unset when `None`.
    pub enable_thinking: Option<bool>,
    /// The tools the model may call, as OpenAI's API lists them (`{"type": "function",
    /// "function": {"name", "description", "parameters"}}`); `None` gives templates `none`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// More variables (OpenAI's `chat_template_kwargs`, `reasoning_effort`); they never
    /// replace the ones above.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatTemplate {
    /// Compiles `source` (or ChatML when `None`).
    pub fn new(
        source: Option<&str>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        Self::with_clock(source, bos_token, eos_token, None)
    }

    /// [`new`](Self::new), with `strftime_now` reading `now` instead of the clock (tests pin
    /// the date a template writes).
    pub fn with_clock(
        source: Option<&str>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
        now: Option<chrono::NaiveDateTime>,
    ) -> Result<Self> {
        let source = source.unwrap_or(CHATML_TEMPLATE);
        if source.len() > limits::MAX_SOURCE {
            return Err(Error::Template(format!(
                "the template is {} KB, longer than the {} KB a chat template may be",
                source.len() >> 10,
                limits::MAX_SOURCE >> 10
            )));
        }
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(limits::FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", move |fmt: String| {
            let now = now.unwrap_or_else(|| chrono::Local::now().naive_local());
            // chrono's `to_string` panics on a format it cannot write (`%Z` of a time with no
            // zone): write it instead, and make that an error.
            let mut out = String::new();
            use std::fmt::Write;
            write!(out, "{}", now.format(&fmt)).map_err(|_| {
                minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("strftime_now: cannot write the format {fmt:?}"),
                )
            })?;
            Ok::<_, minijinja::Error>(out)
        });
        env.add_filter("tojson", json::tojson);
        env.add_filter("string", json::python_string);
        env.add_filter("pprint", json::pprint);
        env.set_formatter(json::formatter);
        // Python's `is iterable`: a string, list or mapping; `none` is not (templates guard a
        // `tools | length` with it, and minijinja would otherwise call none iterable).
        env.add_test("iterable", |v: minijinja::Value| {
            !v.is_none() && !v.is_undefined() && v.try_iter().is_ok()
        });
        let source = json::generation_as_block(source);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| Error::Template(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            system_role: std::sync::OnceLock::new(),
        })
    }

    /// Renders the conversation, ending with the assistant's opening when
    /// `add_generation_prompt` is set (the usual case: the model answers next).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..Default::default()
            },
        )
    }

    /// Renders the conversation with the variables Hugging Face's `apply_chat_template` gives a
    /// template: the messages, `tools` (none unless given) and `documents` (none), the
    /// generation prompt switch, the special tokens, `enable_thinking` when set, and the
    /// caller's extra variables. Under [`limits`]: whatever the template does, this returns.
    pub fn render_with(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        limits::guarded(|| self.render_unguarded(messages, options))
    }

    fn render_unguarded(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        use minijinja::Value as V;
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(describe(&e)))?;
        // The caller's variables first, so the ones Hugging Face sets always win over them;
        // `enable_thinking` only when it is set here.
        let mut ctx: std::collections::BTreeMap<String, V> = options
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), V::from_serialize(v)))
            .collect();
        let views: Vec<serde_json::Value> = messages.iter().map(template_view).collect();
        ctx.insert("messages".into(), V::from_serialize(&views));
        let tools = options
            .tools
            .as_ref()
            .map_or(V::from(()), V::from_serialize);
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), V::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            V::from(options.add_generation_prompt),
        );
        ctx.insert("bos_token".into(), V::from(self.bos_token.as_str()));
        ctx.insert("eos_token".into(), V::from(self.eos_token.as_str()));
        if let Some(on) = options.enable_thinking {
            ctx.insert("enable_thinking".into(), V::from(on));
        }
        let mut out = limits::Capped::default();
        tmpl.render_captured_to(V::from(ctx), &mut out)
            .map_err(|e| {
                use minijinja::ErrorKind as K;
                let limit = limits::tripped() || matches!(e.kind(), K::OutOfFuel | K::WriteFailure);
                match limit {
                    true => Error::TemplateLimit(describe(&e)),
                    false => Error::Template(describe(&e)),
                }
            })?;
        String::from_utf8(out.0).map_err(|e| Error::Template(e.to_string()))
    }

    /// Whether the template does anything with `tools` (else tools are described in the
    /// system message, see [`crate::tools`]).
    pub fn reads_tools(&self) -> bool {
        self.source.contains("tools")
    }

    /// The template's source, as compiled.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// A template error as the user should read it: `raise_exception`'s message alone (the
/// template author's explanation), else the error with the template's line.
fn describe(e: &minijinja::Error) -> String {
    use minijinja::ErrorKind as K;
    match (e.kind(), e.detail()) {
        (K::InvalidOperation, Some(detail)) => return detail.to_owned(),
        (K::OutOfFuel, _) => {
            return format!(
                "the template ran past {} steps (an endless loop?)",
                limits::FUEL
            )
        }
        (K::WriteFailure, _) => {
            return format!(
                "the rendered prompt grew past {} MB",
                limits::MAX_RENDERED >> 20
            )
        }
        _ => {}
    }
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_turns_and_the_generation_prompt() {
        let t = ChatTemplate::new(None, "<s>", "</s>").unwrap();
        let s = t
            .render(&[Message::system("Be brief."), Message::user("Hi")], true)
            .unwrap();
        assert_eq!(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let s = t.render(&[Message::user("Hi")], false).unwrap();
        assert!(!s.ends_with("assistant\n"));
    }

    #[test]
    fn hf_style_templates_work_with_bos_pycompat_and_trimmed_blocks() {
        // Shaped like Llama/Mistral templates: bos_token, .strip(), loop.index0, trim/lstrip blocks.
        let src = "{{ bos_token }}{% for m in messages %}\n    {% if m['role'] == 'user' %}\n[INST] {{ m['content'].strip() }} [/INST]\n    {% else %}\n{{ m['content'] }}{{ eos_token }}\n    {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(Some(src), "<s>", "</s>").unwrap();
        let s = t
            .render(
                &[Message::user("  hello  "), Message::assistant("hi")],
                true,
            )
            .unwrap();
        assert_eq!(s, "<s>[INST] hello [/INST]\nhi</s>\n");
    }

    #[test]
    fn raise_exception_becomes_a_template_error_with_its_message() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}";
        let t = ChatTemplate::new(Some(src), "", "").unwrap();
        let err = t.render(&[Message::assistant("x")], true).unwrap_err();
        assert!(
            err.to_string()
                .contains("Conversations must start with a user message"),
            "{err}"
        );
    }

    #[test]
    fn strftime_now_is_available() {
        let t = ChatTemplate::new(Some("{{ strftime_now('%Y') }}"), "", "").unwrap();
        let year: i32 = t.render(&[], false).unwrap().parse().unwrap();
        assert!(year >= 2024);
    }

    #[test]
    fn a_broken_template_is_a_clear_error() {
        assert!(matches!(
            ChatTemplate::new(Some("{% for %}"), "", ""),
            Err(Error::Template(_))
        ));
    }
}
