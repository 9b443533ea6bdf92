//! Chat templates: from a list of messages to the exact prompt text the model was trained on.
//!
//! Models ship their template as Jinja in `tokenizer.chat_template` (GGUF) or in
//! `tokenizer_config.json`. We render it with minijinja, configured like Hugging Face's
//! `apply_chat_template` (trim_blocks, lstrip_blocks, Python string methods through
//! minijinja-contrib's pycompat) with the globals HF templates use: `bos_token`, `eos_token`,
//! `add_generation_prompt`, `enable_thinking`, `tools`, `raise_exception`, `strftime_now` and a
//! `tojson` that writes JSON as Python's `json.dumps` does (`template_json.rs`). Every template in
//! llama.cpp's folder renders byte for byte as Python's jinja2 renders it, for a fixed set of
//! conversations (tested). A template that cannot render is an error naming its line, never a
//! silent fallback. A file without a template gets ChatML, which most small instruct models
//! understand.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// ChatML, for models that carry no template of their own.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template with the special tokens it may refer to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
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
        let mut env = minijinja::Environment::new();
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
            now.format(&fmt).to_string()
        });
        env.add_filter("tojson", crate::template_json::tojson);
        // Python's `is iterable`: a string, list or mapping; `none` is not (templates guard a
        // `tools | length` with it, and minijinja would otherwise call none iterable).
        env.add_test("iterable", |v: minijinja::Value| {
            !v.is_none() && !v.is_undefined() && v.try_iter().is_ok()
        });
        let source = crate::template_json::generation_as_block(source.unwrap_or(CHATML_TEMPLATE));
        env.add_template_owned("chat", source)
            .map_err(|e| Error::Template(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
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
    /// template: the messages, `tools` and `documents` (none), the generation prompt switch,
    /// the special tokens, and `enable_thinking` when set.
    pub fn render_with(&self, messages: &[Message], options: &RenderOptions) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Template(describe(&e)))?;
        let thinking = options
            .enable_thinking
            .map_or(minijinja::Value::UNDEFINED, minijinja::Value::from);
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => minijinja::Value::from(()),
            documents => minijinja::Value::from(()),
            add_generation_prompt => options.add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
            enable_thinking => thinking,
        })
        .map_err(|e| Error::Template(describe(&e)))
    }
}

/// A template error as the user should read it: `raise_exception`'s message alone (the
/// template author's explanation), else the error with the template's line.
fn describe(e: &minijinja::Error) -> String {
    if let (minijinja::ErrorKind::InvalidOperation, Some(detail)) = (e.kind(), e.detail()) {
        return detail.to_owned();
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
