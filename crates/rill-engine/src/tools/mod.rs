//! Tool calls: what a model writes when it calls a function, read back into calls as the text
//! streams in, one parser per format behind one trait ([`ToolParser`]), the format chosen
//! from the chat template ([`ToolFormat::of`]):
//!
//! - **Hermes** (Qwen 2.5/3, Hermes, SmolLM3, …): `<tool_call>{"name": …, "arguments": …}</tool_call>`;
//! - **Llama 3.x**: the answer is `{"name": …, "parameters": …}` (after `<|python_tag|>` or not);
//! - **Mistral**: `[TOOL_CALLS][{"name": …, "arguments": …}, …]`, or the newer
//!   `[TOOL_CALLS]name[ARGS]{…}`;
//! - **harmony** (gpt-oss): messages of channels, `<|channel|>commentary to=functions.f …<|message|>{…}<|call|>`,
//!   the analysis channel being reasoning.
//!
//! A template that does nothing with `tools` (SmolLM2's) gets the tools described in its system
//! message and the Hermes format ([`prompt`]). [`ToolStream`] turns any parser's output into
//! [`Piece`]s: content, reasoning, a call's start (its name) and its arguments in fragments, so
//! an API can stream `delta.tool_calls` as OpenAI does; the whole answer is the same pieces
//! gathered ([`Calls`]), so a streamed answer and a whole one never differ.

mod formats;
mod harmony;
pub mod prompt;
mod scan;

pub(crate) use harmony::Harmony;

pub use crate::message::ToolCall;

/// How a model family writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Harmony,
}

impl ToolFormat {
    /// The format a chat template's model writes, read from the template's own text (its
    /// markers); a template with no known markers is given Hermes's.
    pub fn of(template_source: &str) -> ToolFormat {
        let has = |m: &str| template_source.contains(m);
        if has("<|channel|>") {
            ToolFormat::Harmony
        } else if has("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if has("<tool_call>") {
            ToolFormat::Hermes
        } else if has("<|python_tag|>") || (has("<|start_header_id|>") && has("\"parameters\"")) {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }

    /// A fresh parser for one answer.
    pub fn parser(self) -> Box<dyn ToolParser> {
        match self {
            ToolFormat::Hermes => Box::<formats::Hermes>::default(),
            ToolFormat::Llama3 => Box::<formats::Llama3>::default(),
            ToolFormat::Mistral => Box::<formats::Mistral>::default(),
            ToolFormat::Harmony => Box::<harmony::Harmony>::default(),
        }
    }

    /// Control tokens whose text the parser needs to see (the detokeniser drops control
    /// tokens' text otherwise).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::Harmony => &[
                "<|start|>",
                "<|channel|>",
                "<|message|>",
                "<|constrain|>",
                "<|end|>",
                "<|call|>",
                "<|return|>",
            ],
        }
    }
}

/// What a parser reads in the text, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Raw {
    Content(String),
    Reasoning(String),
    /// A call starts; its name is known.
    Call(String),
    /// More of the last call's arguments (JSON text).
    Arguments(String),
}

/// One format's reader. Text arrives in pieces cut anywhere (between characters); what is
/// read is pushed to `out` as soon as it is certain.
pub trait ToolParser: Send {
    fn push(&mut self, text: &str, out: &mut Vec<Raw>);
    /// The answer ended: what is held back. An unfinished call keeps what arrived of it.
    fn finish(&mut self, out: &mut Vec<Raw>);
}

/// What the answer's text turned out to be, for an API to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// Call `index` (0, 1, … in order) starts.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments {
        index: usize,
        text: String,
    },
}

/// A parser with the bookkeeping around it: calls numbered in order, and whitespace next to
/// calls dropped (content that is only whitespace is held until text follows it).
pub struct ToolStream {
    parser: Box<dyn ToolParser>,
    calls: usize,
    spaces: String,
    raw: Vec<Raw>,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        ToolStream {
            parser: format.parser(),
            calls: 0,
            spaces: String::new(),
            raw: Vec::new(),
        }
    }

    /// The pieces that `text`, the answer's next text, makes certain.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.parser.push(text, &mut self.raw);
        self.pieces()
    }

    /// The pieces held back until the end.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.parser.finish(&mut self.raw);
        let pieces = self.pieces();
        self.spaces.clear();
        pieces
    }

    /// How many calls have started.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn pieces(&mut self) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for raw in std::mem::take(&mut self.raw) {
            match raw {
                Raw::Content(t) if t.is_empty() => {}
                Raw::Content(t) => {
                    let trimmed = t.trim_end();
                    if trimmed.is_empty() {
                        self.spaces.push_str(&t);
                        continue;
                    }
                    let mut text = std::mem::take(&mut self.spaces);
                    text.push_str(trimmed);
                    self.spaces.push_str(&t[trimmed.len()..]);
                    match out.last_mut() {
                        Some(Piece::Content(prev)) => prev.push_str(&text),
                        _ => out.push(Piece::Content(text)),
                    }
                }
                Raw::Reasoning(t) if t.is_empty() => {}
                Raw::Reasoning(t) => match out.last_mut() {
                    Some(Piece::Reasoning(prev)) => prev.push_str(&t),
                    _ => out.push(Piece::Reasoning(t)),
                },
                Raw::Call(name) => {
                    self.spaces.clear();
                    out.push(Piece::CallStart {
                        index: self.calls,
                        name,
                    });
                    self.calls += 1;
                }
                Raw::Arguments(t) if t.is_empty() || self.calls == 0 => {}
                Raw::Arguments(t) => {
                    let index = self.calls - 1;
                    match out.last_mut() {
                        Some(Piece::Arguments { index: i, text }) if *i == index => {
                            text.push_str(&t)
                        }
                        _ => out.push(Piece::Arguments { index, text: t }),
                    }
                }
            }
        }
        out
    }
}

/// An answer's pieces gathered: its content, its reasoning and its calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    pub content: String,
    pub reasoning: String,
    /// Names and arguments; ids are the caller's to give (empty here).
    pub calls: Vec<ToolCall>,
}

impl Calls {
    pub fn add(&mut self, piece: &Piece) {
        match piece {
            Piece::Content(t) => self.content.push_str(t),
            Piece::Reasoning(t) => self.reasoning.push_str(t),
            Piece::CallStart { name, .. } => self.calls.push(ToolCall {
                id: String::new(),
                name: name.clone(),
                arguments: String::new(),
            }),
            Piece::Arguments { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.arguments.push_str(text);
                }
            }
        }
    }

    /// Reads a whole answer in `format`.
    pub fn parse(format: ToolFormat, text: &str) -> Calls {
        let mut stream = ToolStream::new(format);
        let mut all = Calls::default();
        for p in stream.push(text).iter().chain(&stream.finish()) {
            all.add(p);
        }
        all
    }
}

/// A new call id: 9 letters and digits, the shape Mistral's templates insist on (and any
/// other client takes).
pub fn call_id(seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    // splitmix64: distinct seeds give distinct-looking ids.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (0..9)
        .map(|i| ALPHABET[((z >> (i * 7)) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

#[cfg(test)]
mod tests;
