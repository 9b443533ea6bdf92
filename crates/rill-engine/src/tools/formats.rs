//! The parsers of the JSON tool-call formats (see [`super`]; harmony's is in `harmony.rs`).
//! Each keeps the text it cannot be sure of yet (a marker's first half, a call object whose
//! name has not arrived) and gives the rest at once.

use super::scan::{self, progress};
use super::{Raw, ToolParser};

/// Where `marker` is in `buf`: `Ok(at)`, or `Err(safe)`, the length of `buf` that cannot be
/// the start of it (the rest may be its first half).
fn find(buf: &str, marker: &str) -> Result<usize, usize> {
    find_any(buf, &[marker]).map(|(at, _)| at)
}

/// The first of `markers` in `buf`, with which it is; else the length that is safe to give.
pub(super) fn find_any<'m>(buf: &str, markers: &[&'m str]) -> Result<(usize, &'m str), usize> {
    let first = markers
        .iter()
        .filter_map(|m| buf.find(m).map(|at| (at, *m)))
        .min_by_key(|&(at, _)| at);
    if let Some(found) = first {
        return Ok(found);
    }
    // The longest end of `buf` that begins some marker is held back.
    let held = (1..=buf.len())
        .rev()
        .filter(|&n| buf.is_char_boundary(buf.len() - n))
        .find(|&n| markers.iter().any(|m| m.starts_with(&buf[buf.len() - n..])))
        .unwrap_or(0);
    Err(buf.len() - held)
}

/// How one call object's reading went.
enum Followed {
    Going,
    /// The object ended; the text after it.
    Done(String),
    /// It is not a call object after all: all of its text.
    NotACall(String),
}

/// Follows one JSON call object (`{"name": …, <arguments key>: …}`), giving the call as soon
/// as its name and the start of its arguments are known, then the arguments as they come.
/// Once the call has started only the new text is read ([`scan::ValueEnd`]).
struct Follower {
    text: String,
    arg_keys: &'static [&'static str],
    /// How much of the arguments was given, once the call started.
    sent: Option<usize>,
    /// Where the arguments start, once the call started, and where they end once they do.
    args: Option<(usize, Option<usize>)>,
    /// Reads the arguments' value as it grows.
    value: scan::ValueEnd,
}

/// The most text a call object may hold before its name and arguments start (a model that
/// writes more is not writing a call): it bounds the reading of its head again at each token.
pub(super) const MAX_HEAD: usize = 64 << 10;

impl Follower {
    fn new(arg_keys: &'static [&'static str]) -> Self {
        Follower {
            text: String::new(),
            arg_keys,
            sent: None,
            args: None,
            value: scan::ValueEnd::default(),
        }
    }

    fn push(&mut self, s: &str, out: &mut Vec<Raw>) -> Followed {
        self.text.push_str(s);
        if self.sent.is_none() {
            let p = progress(&self.text, self.arg_keys);
            if p.bad || (p.end.is_some() && p.name.is_none()) || self.text.len() > MAX_HEAD {
                return Followed::NotACall(std::mem::take(&mut self.text));
            }
            match (&p.name, p.args, p.end) {
                (Some(name), Some((start, end)), _) => {
                    out.push(Raw::Call(name.clone()));
                    self.sent = Some(start);
                    self.args = Some((start, end));
                }
                // A call with no arguments at all.
                (Some(name), None, Some(end)) => {
                    out.push(Raw::Call(name.clone()));
                    out.push(Raw::Arguments("{}".into()));
                    return Followed::Done(self.text[end..].to_owned());
                }
                _ => return Followed::Going,
            }
        }
        let Some((start, known_end)) = self.args else {
            return Followed::Going;
        };
        let b = self.text.as_bytes();
        let streams = matches!(b[start], b'{' | b'[');
        let end = match known_end {
            Some(end) => Some(end),
            None if matches!(b[start], b'{' | b'[' | b'"') => self.value.find(b, start),
            // A number or literal: short, read whole.
            None => scan::value_end(b, start),
        };
        self.args = Some((start, end));
        let sent = self.sent.unwrap_or(start);
        match end {
            Some(end) => {
                if sent < end {
                    if streams {
                        out.push(Raw::Arguments(self.text[sent..end].to_owned()));
                    } else {
                        out.push(Raw::Arguments(scan::arguments(&self.text[start..end])));
                    }
                }
                self.sent = Some(end);
                // What follows the arguments, read as the rest of the object (`{` + it).
                let tail = format!("{{{}", &self.text[end..]);
                let p = progress(&tail, &[]);
                match (p.end, p.bad) {
                    (Some(close), _) => Followed::Done(self.text[end + close - 1..].to_owned()),
                    // Something other than `}` after the arguments: the call is what it is.
                    (None, true) => Followed::Done(self.text[end..].to_owned()),
                    (None, false) => Followed::Going,
                }
            }
            None if streams => {
                out.push(Raw::Arguments(self.text[sent..].to_owned()));
                self.sent = Some(self.text.len());
                Followed::Going
            }
            None => Followed::Going,
        }
    }

    /// The answer ended inside the object: the unread text, if the call never started.
    fn finish(&mut self, out: &mut Vec<Raw>) -> Option<String> {
        match self.sent {
            None => Some(std::mem::take(&mut self.text)),
            Some(sent) => {
                if let Some((start, None)) = self.args {
                    if sent >= start && sent < self.text.len() {
                        out.push(Raw::Arguments(self.text[sent..].to_owned()));
                    }
                }
                None
            }
        }
    }
}

const NAME_ARGUMENTS: &[&str] = &["arguments"];
const NAME_PARAMETERS: &[&str] = &["parameters", "arguments"];

/// `<tool_call>{…}</tool_call>`, anywhere in the answer.
#[derive(Default)]
pub(super) struct Hermes {
    buf: String,
    state: HermesState,
}

#[derive(Default)]
enum HermesState {
    #[default]
    Content,
    Call(Follower),
    /// After a call's object: everything up to `</tool_call>` is dropped.
    Closing,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolParser for Hermes {
    fn push(&mut self, text: &str, out: &mut Vec<Raw>) {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                HermesState::Content => match find(&self.buf, OPEN) {
                    Ok(at) => {
                        out.push(Raw::Content(self.buf[..at].to_owned()));
                        self.buf.drain(..at + OPEN.len());
                        self.state = HermesState::Call(Follower::new(NAME_ARGUMENTS));
                    }
                    Err(safe) => {
                        out.push(Raw::Content(self.buf[..safe].to_owned()));
                        self.buf.drain(..safe);
                        return;
                    }
                },
                HermesState::Call(f) => match f.push(&std::mem::take(&mut self.buf), out) {
                    Followed::Going => return,
                    Followed::Done(rest) => {
                        self.buf = rest;
                        self.state = HermesState::Closing;
                    }
                    Followed::NotACall(text) => {
                        out.push(Raw::Content(OPEN.to_owned()));
                        self.buf = text;
                        self.state = HermesState::Content;
                    }
                },
                HermesState::Closing => match find(&self.buf, CLOSE) {
                    Ok(at) => {
                        self.buf.drain(..at + CLOSE.len());
                        self.state = HermesState::Content;
                    }
                    Err(safe) => {
                        self.buf.drain(..safe);
                        return;
                    }
                },
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Raw>) {
        match &mut self.state {
            HermesState::Content => out.push(Raw::Content(std::mem::take(&mut self.buf))),
            HermesState::Call(f) => {
                if let Some(text) = f.finish(out) {
                    out.push(Raw::Content(format!("{OPEN}{text}")));
                }
            }
            HermesState::Closing => {}
        }
        self.state = HermesState::Content;
    }
}

/// Llama 3.x: the answer is one call object, or several separated by `;` or newlines,
/// possibly after `<|python_tag|>`; an answer that starts otherwise is content.
#[derive(Default)]
pub(super) struct Llama3 {
    buf: String,
    state: Llama3State,
}

#[derive(Default)]
enum Llama3State {
    /// Nothing but whitespace yet (or between calls).
    #[default]
    Start,
    Call(Follower),
    Content,
}

const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolParser for Llama3 {
    fn push(&mut self, text: &str, out: &mut Vec<Raw>) {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                Llama3State::Start => {
                    let rest = self
                        .buf
                        .trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    if rest.is_empty() || (PYTHON_TAG.starts_with(rest) && rest != PYTHON_TAG) {
                        return;
                    }
                    if let Some(after) = rest.strip_prefix(PYTHON_TAG) {
                        self.buf = after.to_owned();
                        continue;
                    }
                    if rest.starts_with('{') {
                        self.buf = rest.to_owned();
                        self.state = Llama3State::Call(Follower::new(NAME_PARAMETERS));
                    } else {
                        self.state = Llama3State::Content;
                    }
                }
                Llama3State::Call(f) => match f.push(&std::mem::take(&mut self.buf), out) {
                    Followed::Going => return,
                    Followed::Done(rest) => {
                        self.buf = rest;
                        self.state = Llama3State::Start;
                    }
                    Followed::NotACall(text) => {
                        self.buf = text;
                        self.state = Llama3State::Content;
                    }
                },
                Llama3State::Content => {
                    out.push(Raw::Content(std::mem::take(&mut self.buf)));
                    return;
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Raw>) {
        match &mut self.state {
            Llama3State::Call(f) => {
                if let Some(text) = f.finish(out) {
                    out.push(Raw::Content(text));
                }
            }
            _ => out.push(Raw::Content(std::mem::take(&mut self.buf))),
        }
        self.state = Llama3State::Start;
    }
}

/// Mistral: content until `[TOOL_CALLS]`, then a JSON array of call objects (Mistral Nemo,
/// v0.3) or `name[ARGS]{…}` (Mistral Small 3.2, Devstral: the v11 tokenizer's form, with an
/// optional `[CALL_ID]id` before `[ARGS]`).
#[derive(Default)]
pub(super) struct Mistral {
    buf: String,
    state: MistralState,
}

#[derive(Default)]
enum MistralState {
    #[default]
    Content,
    /// Just after `[TOOL_CALLS]`: which form follows.
    Start,
    /// Inside the array, between objects.
    Array,
    ArrayCall(Follower),
    /// Reading a name up to `[ARGS]`.
    Name,
    /// The arguments' JSON value after `[ARGS]`: how much of it was given, and its reader.
    Args(usize, scan::ValueEnd),
}

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

impl ToolParser for Mistral {
    fn push(&mut self, text: &str, out: &mut Vec<Raw>) {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                MistralState::Content => match find(&self.buf, TOOL_CALLS) {
                    Ok(at) => {
                        out.push(Raw::Content(self.buf[..at].to_owned()));
                        self.buf.drain(..at + TOOL_CALLS.len());
                        self.state = MistralState::Start;
                    }
                    Err(safe) => {
                        out.push(Raw::Content(self.buf[..safe].to_owned()));
                        self.buf.drain(..safe);
                        return;
                    }
                },
                MistralState::Start => {
                    let rest = self.buf.trim_start();
                    if rest.is_empty() {
                        return;
                    }
                    self.state = if let Some(after) = rest.strip_prefix('[') {
                        self.buf = after.to_owned();
                        MistralState::Array
                    } else {
                        self.buf = rest.to_owned();
                        MistralState::Name
                    };
                }
                MistralState::Array => {
                    let rest = self
                        .buf
                        .trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                    match rest.chars().next() {
                        None => {
                            self.buf.clear();
                            return;
                        }
                        Some(']') => {
                            self.buf = rest[1..].to_owned();
                            self.state = MistralState::Content;
                        }
                        Some(_) => {
                            self.buf = rest.to_owned();
                            self.state = MistralState::ArrayCall(Follower::new(NAME_ARGUMENTS));
                        }
                    }
                }
                MistralState::ArrayCall(f) => match f.push(&std::mem::take(&mut self.buf), out) {
                    Followed::Going => return,
                    Followed::Done(rest) => {
                        self.buf = rest;
                        self.state = MistralState::Array;
                    }
                    Followed::NotACall(text) => {
                        out.push(Raw::Content(format!("{TOOL_CALLS}[")));
                        self.buf = text;
                        self.state = MistralState::Content;
                    }
                },
                MistralState::Name => match find(&self.buf, ARGS) {
                    Ok(at) => {
                        let head = &self.buf[..at];
                        let name = head.split(CALL_ID).next().unwrap_or(head).trim();
                        out.push(Raw::Call(name.to_owned()));
                        self.buf.drain(..at + ARGS.len());
                        self.state = MistralState::Args(0, scan::ValueEnd::default());
                    }
                    // No name is this long: it was text (and is read again at each token
                    // only up to here).
                    Err(_) if self.buf.len() > MAX_HEAD => {
                        out.push(Raw::Content(format!("{TOOL_CALLS}{}", self.buf)));
                        self.buf.clear();
                        self.state = MistralState::Content;
                    }
                    Err(_) => return,
                },
                MistralState::Args(sent, value) => {
                    let start = self.buf.len() - self.buf.trim_start().len();
                    let b = self.buf.as_bytes();
                    if start >= b.len() {
                        return;
                    }
                    let streams = matches!(b[start], b'{' | b'[');
                    let end = match b[start] {
                        b'{' | b'[' | b'"' => value.find(b, start),
                        _ => scan::value_end(b, start),
                    };
                    match end {
                        Some(end) => {
                            let args = if streams {
                                self.buf[(*sent).max(start)..end].to_owned()
                            } else {
                                scan::arguments(&self.buf[start..end])
                            };
                            out.push(Raw::Arguments(args));
                            self.buf.drain(..end);
                            self.state = MistralState::Content;
                        }
                        None if streams => {
                            out.push(Raw::Arguments(self.buf[(*sent).max(start)..].to_owned()));
                            *sent = self.buf.len();
                            return;
                        }
                        None => return,
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<Raw>) {
        match std::mem::take(&mut self.state) {
            MistralState::Content => out.push(Raw::Content(std::mem::take(&mut self.buf))),
            MistralState::ArrayCall(mut f) => {
                if let Some(text) = f.finish(out) {
                    out.push(Raw::Content(format!("{TOOL_CALLS}[{text}")));
                }
            }
            MistralState::Args(sent, _) => {
                let b = self.buf.as_bytes();
                let start = self.buf.len() - self.buf.trim_start().len();
                if start < b.len() && matches!(b[start], b'{' | b'[') && sent < b.len() {
                    out.push(Raw::Arguments(self.buf[sent.max(start)..].to_owned()));
                }
            }
            // An unfinished name is text the model wrote: shown, not dropped (issue 40).
            MistralState::Name if !self.buf.trim().is_empty() => {
                out.push(Raw::Content(format!("{TOOL_CALLS}{}", self.buf)))
            }
            MistralState::Start | MistralState::Array | MistralState::Name => {}
        }
        self.buf.clear();
    }
}
