//! From a request's prompt to the ids the engine runs: the chat template with what it is given
//! besides the messages ([`ChatArgs`]: tools, `chat_template_kwargs`), tools described in the
//! system message for a template that knows none ([`crate::tools::prompt`]), and the fitting
//! of a long conversation into the context; and where a thinking model's answer starts (in a
//! block its template opened, or one opened for a grammar).

use serde_json::Value;

use crate::error::{Error, Result};
use crate::message::{ImageData, IMAGE_MARKER};
use crate::request::{ChatArgs, GenerateRequest, Overflow, Prompt};
use crate::template::{fold_system, ChatTemplate, Message, RenderOptions, Role, Thinking};
use crate::tokenizer::Tokenizer;
use crate::tools::{self, ToolFormat};
use crate::vision::Vision;

/// What rendering and tokenising a prompt needs of the model: its chat template, tokenizer,
/// context and how it thinks. [`crate::Handle`] makes one for each request.
pub(crate) struct Prompter<'a> {
    pub(crate) template: &'a ChatTemplate,
    pub(crate) tokenizer: &'a Tokenizer,
    pub(crate) context_length: usize,
    pub(crate) thinking: Option<Thinking>,
    /// The vision projector, when the model has one.
    pub(crate) vision: Option<&'a Vision>,
}

impl Prompter<'_> {
    /// The conversation rendered with tools and template variables. A template that does not
    /// read `tools` gets them described in the system message, and past calls and results
    /// written out, in the Hermes format; one without a system role gets the system message
    /// folded into the next (`template::fold_system`, as llama.cpp's chat code does).
    pub(crate) fn render_chat(&self, messages: &[Message], args: &ChatArgs) -> Result<String> {
        let template = &self.template;
        let described;
        let history = messages
            .iter()
            .any(|m| m.role == Role::Tool || !m.tool_calls.is_empty());
        let (messages, tools) = if template.reads_tools() {
            let tools = (!args.tools.is_empty()).then(|| args.tools.clone());
            (messages, tools)
        } else if args.tools.is_empty() && !history {
            (messages, None)
        } else {
            described = tools::prompt::described(messages, &args.tools);
            (described.as_slice(), None)
        };
        let folded;
        let messages = match messages.first().is_some_and(|m| m.role == Role::System)
            && !template.system_role()
        {
            true => {
                folded = fold_system(messages);
                &folded[..]
            }
            false => messages,
        };
        let options = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: None,
            tools,
            extra: args.kwargs.clone(),
        };
        template.render_with(messages, &options)
    }

    /// How this model writes tool calls (from its chat template).
    pub(crate) fn tool_format(&self) -> ToolFormat {
        ToolFormat::of(self.template.source())
    }

    /// The grammar that makes the model call `tools` (name, parameter schema) in its own
    /// format, one call or several (`parallel`); `None` where the format cannot be forced
    /// yet (harmony) or the model's vocabulary lacks the format's control tokens.
    pub(crate) fn tool_grammar(&self, tools: &[(String, Value)], parallel: bool) -> Option<String> {
        let format = self.tool_format();
        let control = |text: &str| self.control_token(text);
        let tokens = match format {
            ToolFormat::Mistral => tools::prompt::CallTokens {
                tool_calls: control("[TOOL_CALLS]"),
                // Only where the template writes calls as `name[ARGS]{…}`.
                args: self
                    .template
                    .source()
                    .contains("[ARGS]")
                    .then(|| control("[ARGS]"))
                    .flatten(),
            },
            _ => tools::prompt::CallTokens::default(),
        };
        tools::prompt::grammar(format, tools, parallel, tokens)
    }

    /// The control tokens of `format`'s markers, whose text an answer with tools must keep.
    pub(crate) fn marker_ids(&self, format: ToolFormat) -> Vec<u32> {
        format
            .markers()
            .iter()
            .filter_map(|m| self.control_token(m))
            .collect()
    }

    /// The id of the control token whose text is `text`, if the vocabulary has one.
    fn control_token(&self, text: &str) -> Option<u32> {
        let tok = &self.tokenizer;
        match tok.encode_with(text, false).ok()?.as_slice() {
            [id] if tok.piece_bytes(*id).is_empty() => Some(*id),
            _ => None,
        }
    }

    /// The prompt's token ids, as the engine will run them, a conversation rendered with `args`.
    pub(crate) fn tokenize_chat(&self, prompt: &Prompt, args: &ChatArgs) -> Result<Vec<u32>> {
        let empty = || Error::param("prompt", "is empty");
        let ids = match prompt {
            Prompt::Messages(m) => {
                let said = |m: &Message| {
                    !m.content.trim().is_empty() || !m.tool_calls.is_empty() || !m.images.is_empty()
                };
                if !m.iter().any(said) {
                    return Err(empty());
                }
                match m.iter().any(|m| !m.images.is_empty()) {
                    true => self.tokenize_with_images(m, args)?,
                    false => self.tokenizer.encode(&self.render_chat(m, args)?)?,
                }
            }
            Prompt::Text(t) if t.is_empty() => return Err(empty()),
            Prompt::Text(t) => self.tokenizer.encode(t)?,
            Prompt::Pictured { text, .. } if text.is_empty() => return Err(empty()),
            Prompt::Pictured { text, images } => {
                self.tokenize_marked(text, &images.iter().collect::<Vec<_>>())?
            }
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size() as u32;
                if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                    return Err(Error::param(
                        "prompt",
                        format!("token id {bad} is outside the vocabulary (size {vocab})"),
                    ));
                }
                ids.clone()
            }
        };
        if ids.is_empty() {
            return Err(empty());
        }
        Ok(ids)
    }

    /// A conversation with images: each message's images stand before its text as markers
    /// while the template renders ([`render_marked`](Self::render_marked)), then each marker
    /// becomes the image's tokens ([`tokenize_marked`](Self::tokenize_marked)).
    fn tokenize_with_images(&self, messages: &[Message], args: &ChatArgs) -> Result<Vec<u32>> {
        let text = self.render_marked(messages, args)?;
        let images: Vec<_> = messages.iter().flat_map(|m| &m.images).collect();
        self.tokenize_marked(&text, &images)
    }

    /// The conversation rendered with each message's images standing before its text as
    /// [`IMAGE_MARKER`]s, in order.
    pub(crate) fn render_marked(&self, messages: &[Message], args: &ChatArgs) -> Result<String> {
        let marked: Vec<Message> = messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if !m.images.is_empty() {
                    m.content = format!("{}{}", IMAGE_MARKER.repeat(m.images.len()), m.content);
                }
                m
            })
            .collect();
        self.render_chat(&marked, args)
    }

    /// Text with a marker per image of `images` (in order) as the engine runs it: each marker
    /// the image's opening tokens, a placeholder per row and its closing tokens, the text
    /// between tokenised piece by piece, as llama.cpp's `mtmd_tokenize` does.
    fn tokenize_marked(&self, text: &str, images: &[&ImageData]) -> Result<Vec<u32>> {
        let Some(vision) = self.vision else {
            return Err(no_projector());
        };
        let pieces: Vec<&str> = text.split(IMAGE_MARKER).collect();
        if pieces.len() != images.len() + 1 {
            return Err(Error::Template(format!(
                "the chat template wrote {} of the conversation's {} images",
                pieces.len() - 1,
                images.len()
            )));
        }
        let (begin, end) = vision.markers();
        let mut ids = self.tokenizer.encode(pieces[0])?;
        for (image, piece) in images.iter().zip(&pieces[1..]) {
            ids.extend_from_slice(begin);
            ids.extend(std::iter::repeat_n(
                image.placeholder(),
                vision.rows_for(image)?,
            ));
            ids.extend_from_slice(end);
            ids.extend(self.tokenizer.encode_with(piece, false)?);
        }
        Ok(ids)
    }

    /// Fits a conversation into the context under `policy`: the prompt ids and how many
    /// messages were dropped from the front.
    ///
    /// Dropping goes a turn at a time from the front: the oldest message that is not the system
    /// prompt or the last message, with what answers it (the assistant's reply, tool results),
    /// so the roles keep alternating. Which count of turns to drop is found without rendering
    /// for each (issue 40: a long history once cost a full render and tokenisation per dropped
    /// turn, which one request could use to stall the server): every message's text is
    /// tokenised once to estimate what each turn weighs, and the estimate is checked by
    /// rendering, then corrected by bisection, so a fit costs a few renders whatever the
    /// history's length.
    pub(crate) fn fit(
        &self,
        prompt: &Prompt,
        args: &ChatArgs,
        max_tokens: Option<usize>,
        policy: Overflow,
    ) -> Result<(Vec<u32>, usize)> {
        let context = self.context_length;
        let ids = self.tokenize_chat(prompt, args)?;
        // Room to answer: what was asked for, at most a quarter of the window.
        let room = max_tokens.unwrap_or(usize::MAX).min(context / 4).max(1);
        let (ids, dropped) = match (prompt, policy) {
            (Prompt::Messages(all), Overflow::DropOldest) if ids.len() + room > context => {
                self.drop_oldest(all, args, ids, context - room.min(context))?
            }
            _ => (ids, 0),
        };
        if ids.len() >= context {
            return Err(Error::PromptTooLong {
                prompt_tokens: ids.len(),
                context,
            });
        }
        Ok((ids, dropped))
    }

    /// The fewest front turns of `all` to drop for the prompt to fit in `limit` tokens (or all
    /// that can go), with the prompt then; `whole` is the prompt with nothing dropped.
    fn drop_oldest(
        &self,
        all: &[Message],
        args: &ChatArgs,
        whole: Vec<u32>,
        limit: usize,
    ) -> Result<(Vec<u32>, usize)> {
        let steps = drop_steps(all);
        // The conversation with the first `k` steps dropped: system messages stay where they are.
        let kept = |k: usize| -> Vec<Message> {
            let mut gone: usize = steps[..k].iter().sum();
            all.iter()
                .filter(|m| {
                    let drop = gone > 0 && m.role != Role::System;
                    gone -= usize::from(drop);
                    !drop
                })
                .cloned()
                .collect()
        };
        let render =
            |k: usize| -> Result<Vec<u32>> { self.tokenize_chat(&Prompt::Messages(kept(k)), args) };
        // What each step weighs: its messages' text in tokens, plus each message's share of
        // what the template adds around them.
        let tok = &self.tokenizer;
        let text_tokens = |m: &Message| -> usize {
            tok.encode_with(&m.content, false)
                .map_or(0, |ids| ids.len())
        };
        let texts: usize = all.iter().map(text_tokens).sum();
        let per_message = whole.len().saturating_sub(texts) / all.len().max(1);
        let turns: Vec<&Message> = all.iter().filter(|m| m.role != Role::System).collect();
        let mut at = 0;
        let weights: Vec<usize> = steps
            .iter()
            .map(|&n| {
                let w = turns[at..at + n]
                    .iter()
                    .map(|m| text_tokens(m) + per_message)
                    .sum();
                at += n;
                w
            })
            .collect();
        // The estimate: the fewest steps whose weight brings the prompt under the limit.
        let over = whole.len().saturating_sub(limit);
        let mut shed = 0;
        let guess = weights
            .iter()
            .position(|w| {
                shed += w;
                shed >= over
            })
            .map_or(steps.len(), |i| i + 1);
        // Checked, then bisected: `fits(lo)` is false and `fits(hi)` true (or `hi` is every
        // step), and the answer is `hi`.
        let mut cache: Vec<(usize, Vec<u32>)> = vec![(0, whole)];
        let mut at_k = |k: usize| -> Result<Vec<u32>> {
            if let Some((_, ids)) = cache.iter().find(|(c, _)| *c == k) {
                return Ok(ids.clone());
            }
            let ids = render(k)?;
            cache.push((k, ids.clone()));
            Ok(ids)
        };
        let fits = |ids: &Vec<u32>| ids.len() <= limit;
        let (mut lo, mut hi) = (0, steps.len());
        let guessed = at_k(guess)?;
        if fits(&guessed) {
            hi = guess;
            if guess > 0 && !fits(&at_k(guess - 1)?) {
                lo = guess - 1;
            }
        } else {
            lo = guess;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match fits(&at_k(mid)?) {
                true => hi = mid,
                false => lo = mid,
            }
        }
        let dropped = steps[..hi].iter().sum();
        Ok((at_k(hi)?, dropped))
    }
}

/// How many messages each drop takes, in order, counting the conversation without its system
/// messages: the oldest turn and what answers it, never the last message.
fn drop_steps(all: &[Message]) -> Vec<usize> {
    let turns: Vec<Role> = all
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| m.role)
        .collect();
    let mut steps = Vec::new();
    let mut i = 0;
    // A step never takes the last message: the question being answered.
    while i + 1 < turns.len() {
        let mut n = 1;
        while i + n + 1 < turns.len() && matches!(turns[i + n], Role::Assistant | Role::Tool) {
            n += 1;
        }
        steps.push(n);
        i += n;
    }
    steps
}

/// Where a thinking model's answer starts: inside a block its template opened, or one the
/// engine opens for a grammar.
impl Prompter<'_> {
    /// True when the prompt's ids end inside a thinking block that its template opened (the
    /// DeepSeek-R1 distills' `<think>\n`), so the answer starts in its reasoning.
    pub(crate) fn opens_thinking(&self, prompt: &[u32]) -> bool {
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        let text = self.tokenizer.decode(tail);
        text.trim_end().ends_with(crate::reasoning::OPEN)
    }

    /// Opens gpt-oss's analysis message after a harmony prompt (which ends in
    /// `<|start|>assistant`): `<|channel|>analysis<|message|>`, as the model writes it first.
    /// Only for a conversation, where the tokens are in the vocabulary, and where there is
    /// room. True when it opened it.
    pub(crate) fn open_analysis(&self, req: &GenerateRequest, prompt: &mut Vec<u32>) -> bool {
        if !matches!(req.prompt, Prompt::Messages(_)) {
            return false;
        }
        let ids: Option<Vec<u32>> = ["<|channel|>", "analysis", "<|message|>"]
            .iter()
            .enumerate()
            .map(|(i, t)| match i % 2 {
                0 => self.control_token(t).map(|id| vec![id]),
                _ => self.tokenizer.encode_with(t, false).ok(),
            })
            .collect::<Option<Vec<_>>>()
            .map(|parts| parts.concat());
        match ids {
            Some(ids) if prompt.len() + ids.len() + 1 < self.context_length => {
                prompt.extend(ids);
                true
            }
            _ => false,
        }
    }

    /// Under a grammar, which waits for a thinking block to close, opens the block that a
    /// thinking template leaves to its model (Qwen3 writes `<think>` itself): held to the
    /// grammar from its first token, the model could not think at all. Only when the answer
    /// thinks (the template's default, or the request's `enable_thinking`), and there is room.
    /// True when it opened it.
    pub(crate) fn open_thinking(&self, req: &GenerateRequest, prompt: &mut Vec<u32>) -> bool {
        let asked = req
            .chat
            .kwargs
            .get("enable_thinking")
            .and_then(|v| v.as_bool());
        if req.grammar.is_none()
            || !matches!(req.prompt, Prompt::Messages(_))
            || !self.thinking.unwrap_or_default().on(asked)
        {
            return false;
        }
        let Ok(open) = self
            .tokenizer
            .encode_with(&format!("{}\n", crate::reasoning::OPEN), false)
        else {
            return false;
        };
        if prompt.len() + open.len() + 1 >= self.context_length {
            return false;
        }
        prompt.extend(open);
        true
    }
}

/// The error for images sent to a model with no vision projector.
pub(crate) fn no_projector() -> Error {
    Error::Image(
        "this model reads no images: it has no vision projector (an mmproj-*.gguf file beside \
         it, or one chosen by hand)"
            .into(),
    )
}
