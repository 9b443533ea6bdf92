//! gpt-oss's harmony format (see [`super`]): channels of messages, read as they stream.

use super::formats::{find_any, MAX_HEAD};
use super::{Raw, ToolParser};

/// gpt-oss's harmony: a run of messages, each a header (`<|channel|>analysis`, maybe
/// ` to=functions.f`, maybe `<|constrain|>json`) then `<|message|>`, a body, and one of
/// `<|end|>`, `<|call|>`, `<|return|>`. The analysis channel is reasoning, the final and
/// commentary channels content, and a message to `functions.f` is a call of `f` whose body is
/// its arguments. An answer that does not start with a marker is content.
#[derive(Default)]
pub(crate) struct Harmony {
    buf: String,
    state: HarmonyState,
}

#[derive(Default)]
enum HarmonyState {
    #[default]
    Header,
    Body(Channel),
    Plain,
}

#[derive(Clone, Copy)]
enum Channel {
    Reasoning,
    Content,
    Call,
}

const MESSAGE: &str = "<|message|>";
/// What ends a message's body, and (the last three) markup that cannot be in one: a header's
/// tokens a model wrote out of place, dropped, so that no markup reaches the text.
const BODY_ENDS: &[&str] = &[
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
];
const OUT_OF_PLACE: &[&str] = &["<|channel|>", "<|message|>", "<|constrain|>"];

impl Harmony {
    /// A parser inside a message's body already: an answer continued from a partial one, in
    /// its analysis (`reasoning`) or its final message.
    pub(crate) fn resumed(reasoning: bool) -> Harmony {
        Harmony {
            buf: String::new(),
            state: HarmonyState::Body(match reasoning {
                true => Channel::Reasoning,
                false => Channel::Content,
            }),
        }
    }

    /// True inside an analysis message's body (the reasoning).
    pub(crate) fn in_analysis(&self) -> bool {
        matches!(self.state, HarmonyState::Body(Channel::Reasoning))
    }

    /// True once the answer proper has started: a final (or commentary) message's body, or
    /// text that is no harmony message at all.
    pub(crate) fn in_answer(&self) -> bool {
        matches!(
            self.state,
            HarmonyState::Body(Channel::Content) | HarmonyState::Plain
        )
    }

    /// The channel a header opens (and the call's name, for a message to a function).
    fn header(head: &str) -> (Channel, Option<String>) {
        let word_after = |key: &str| {
            head.find(key).map(|at| {
                head[at + key.len()..]
                    .split(|c: char| c.is_whitespace() || c == '<')
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
        };
        if let Some(f) =
            word_after("to=").and_then(|r| r.strip_prefix("functions.").map(str::to_owned))
        {
            return (Channel::Call, Some(f));
        }
        match word_after("<|channel|>").as_deref() {
            Some("analysis") => (Channel::Reasoning, None),
            _ => (Channel::Content, None),
        }
    }
}

impl ToolParser for Harmony {
    fn push(&mut self, text: &str, out: &mut Vec<Raw>) {
        self.buf.push_str(text);
        loop {
            match self.state {
                HarmonyState::Header => {
                    let rest = self.buf.trim_start();
                    if rest.is_empty() {
                        return;
                    }
                    if !(rest.starts_with("<|") || rest == "<") {
                        self.state = HarmonyState::Plain;
                        continue;
                    }
                    let Some(at) = self.buf.find(MESSAGE) else {
                        // No header is this long: it was text (the header is read again at
                        // each token only up to here).
                        if self.buf.len() > MAX_HEAD {
                            self.state = HarmonyState::Plain;
                            continue;
                        }
                        return;
                    };
                    let (channel, name) = Self::header(&self.buf[..at]);
                    if let Some(name) = name {
                        out.push(Raw::Call(name));
                    }
                    self.buf.drain(..at + MESSAGE.len());
                    self.state = HarmonyState::Body(channel);
                }
                HarmonyState::Body(channel) => {
                    let (body, end) = match find_any(&self.buf, BODY_ENDS) {
                        Ok((at, m)) => (at, Some(at + if m == "<|start|>" { 0 } else { m.len() })),
                        Err(safe) => (safe, None),
                    };
                    let text = self.buf[..body].to_owned();
                    out.push(match channel {
                        Channel::Reasoning => Raw::Reasoning(text),
                        Channel::Content => Raw::Content(text),
                        Channel::Call => Raw::Arguments(text),
                    });
                    let out_of_place =
                        end.is_some_and(|e| OUT_OF_PLACE.contains(&&self.buf[body..e]));
                    match end {
                        // Header markup inside a body: dropped, the body goes on.
                        Some(end) if out_of_place => {
                            self.buf.drain(..end);
                        }
                        Some(end) => {
                            self.buf.drain(..end);
                            self.state = HarmonyState::Header;
                        }
                        None => {
                            self.buf.drain(..body);
                            return;
                        }
                    }
                }
                HarmonyState::Plain => {
                    out.push(Raw::Content(std::mem::take(&mut self.buf)));
                    return;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Raw>) {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            HarmonyState::Body(Channel::Reasoning) => out.push(Raw::Reasoning(rest)),
            HarmonyState::Body(Channel::Call) => out.push(Raw::Arguments(rest)),
            HarmonyState::Body(Channel::Content) | HarmonyState::Plain => {
                out.push(Raw::Content(rest))
            }
            // An unfinished header is text the model wrote: shown, not dropped (issue 40).
            HarmonyState::Header if !rest.trim().is_empty() => out.push(Raw::Content(rest)),
            HarmonyState::Header => {}
        }
        self.state = HarmonyState::Header;
    }
}
