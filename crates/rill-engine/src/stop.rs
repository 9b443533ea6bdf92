//! Why a generation ends, and stop strings that span token boundaries.
//!
//! End-of-generation token ids come from the model's metadata (EOS, end-of-turn) and are
//! checked on ids. Stop strings are checked on text: a stop string can start in one token and end
//! in the next, so [`StopStrings`] holds back the tail of the text that could still be the start
//! of a stop string, and releases it once it is ruled out. A matched stop string is never
//! emitted, nor anything after it.

use serde::{Deserialize, Serialize};

/// Why a generation ended. Serialised as the CLI and the API spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    Stop,
    /// The `max_tokens` limit was reached.
    Length,
    /// The caller cancelled, or dropped the receiver.
    Cancelled,
    /// A stop string appeared in the text.
    StopString,
    /// The context window is full.
    ContextFull,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop => "stop",
            StopReason::Length => "length",
            StopReason::Cancelled => "cancelled",
            StopReason::StopString => "stop_string",
            StopReason::ContextFull => "context_full",
        }
    }
}

/// What [`StopStrings::push`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum StopCheck {
    /// No stop string: emit this text (possibly empty, when some is held back).
    Continue(String),
    /// A stop string matched: emit this text, then end the generation.
    Matched(String),
}

/// Incremental stop-string matcher with hold-back.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
}

impl StopStrings {
    /// Empty strings are ignored: they would match everywhere.
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopStrings {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feeds the next piece of text.
    pub fn push(&mut self, text: &str) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Continue(text.to_owned());
        }
        self.held.push_str(text);
        // The earliest full match wins.
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return StopCheck::Matched(out);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopCheck::Continue(out)
    }

    /// Releases what is held back, when the generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopStrings::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopCheck::Continue(t) => out.push_str(&t),
                StopCheck::Matched(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_over_tokens_is_caught_and_not_emitted() {
        assert_eq!(
            run(&["</answer>"], &["Paris", "</ans", "wer>", " more"]),
            ("Paris".into(), true)
        );
    }

    #[test]
    fn text_before_the_stop_in_the_same_token_is_kept() {
        assert_eq!(
            run(&["STOP"], &["one two", " threeSTOPfour"]),
            ("one two three".into(), true)
        );
    }

    #[test]
    fn a_false_start_is_released() {
        let mut m = StopStrings::new(["\n\nUser:".to_string()]);
        assert_eq!(m.push("Hello\n"), StopCheck::Continue("Hello".into()));
        assert_eq!(m.push("\nUs"), StopCheck::Continue("".into()));
        assert_eq!(m.push("ually"), StopCheck::Continue("\n\nUsually".into()));
    }

    #[test]
    fn held_text_comes_out_when_the_generation_ends_otherwise() {
        assert_eq!(run(&["###"], &["a #", "#"]), ("a ##".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_safe() {
        assert_eq!(
            run(&["猫", "cat"], &["犬と猫", "とcat"]),
            ("犬と".into(), true)
        );
        assert_eq!(run(&["é!"], &["café", " ok"]), ("café ok".into(), false));
    }

    #[test]
    fn no_stops_passes_everything_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a"]), ("a".into(), false));
    }
}
