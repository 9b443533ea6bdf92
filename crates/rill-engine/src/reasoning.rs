//! Reasoning apart from content: a thinking model's answer split at its think markers.
//!
//! Qwen3, QwQ and the DeepSeek-R1 distills write `<think>…</think>` before their answer; some
//! templates open the block themselves (the prompt ends in `<think>\n`), so the answer starts
//! inside it. [`ReasoningSplit`] follows a stream of text, in pieces cut anywhere (a marker can
//! span tokens), and gives each piece's reasoning and content apart:
//!
//! - the block is recognised only at the start of the answer (whitespace before it allowed),
//!   as llama.cpp does: a `<think>` later in an answer (a question about HTML tags) is content;
//! - the markers themselves belong to neither part; the whitespace right after each marker
//!   (`<think>\n`, `</think>\n\n`) is dropped;
//! - text that may be the start of a marker is held back until it is ruled in or out, and
//!   [`ReasoningSplit::flush`] releases it at the end;
//! - a block never closed (a cut answer, or a random-weight model) is all reasoning.
//!
//! gpt-oss writes no think markers: its answer is harmony messages (`<|channel|>analysis
//! <|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`), and
//! [`ReasoningSplit::harmony`] reads them with the tool reader's harmony parser
//! (`tools/formats.rs`): the analysis channel is the reasoning, the final (and commentary)
//! channel the content, the markup neither.

use crate::tools::{Harmony, Raw, ToolParser};

/// A thinking block's markers.
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Harmony's (gpt-oss): the assistant's turn as its prompt opens it, the analysis message's
/// start, and the final message's start.
pub const HARMONY_TURN: &str = "<|start|>assistant";
pub const HARMONY_ANALYSIS: &str = "<|channel|>analysis<|message|>";
pub const HARMONY_FINAL: &str = "<|channel|>final<|message|>";

/// Text given back by one push: its reasoning and its content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

impl Parts {
    /// Adds `more`, which follows this text.
    pub fn append(&mut self, more: Parts) {
        self.reasoning.push_str(&more.reasoning);
        self.content.push_str(&more.content);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// Nothing but whitespace yet: a block may still open.
    Start,
    /// Inside the block, right after its opening (leading whitespace is dropped).
    OpenedFresh,
    Reasoning,
    /// Right after the block closed (leading whitespace is dropped).
    ClosedFresh,
    Content,
}

/// Splits one answer's text into reasoning and content.
pub struct ReasoningSplit {
    at: Where,
    /// Text not yet given out: a possible marker's start, or whitespace before a block.
    held: String,
    /// Harmony's channels instead of think markers (gpt-oss).
    harmony: Option<Harmony>,
}

/// What ends a thinking block early (a thinking budget): its closing marker, or in harmony the
/// end of the analysis message and the start of the final one.
const CLOSE_THINK: &str = "\n</think>\n\n";
const CLOSE_ANALYSIS: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

/// The length of the longest end of `text` that is a start of `marker` (shorter than it).
fn partial_marker(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

impl ReasoningSplit {
    /// A split for an answer that starts before any block, or (`inside`) within one that the
    /// prompt opened.
    pub fn new(inside: bool) -> Self {
        ReasoningSplit {
            at: if inside {
                Where::OpenedFresh
            } else {
                Where::Start
            },
            held: String::new(),
            harmony: None,
        }
    }

    /// A split of harmony messages (gpt-oss), from the start of the answer.
    pub fn harmony() -> Self {
        ReasoningSplit {
            harmony: Some(Harmony::default()),
            ..Self::new(false)
        }
    }

    /// A split for an answer that goes on from a partial one: inside its thinking block
    /// (`inside`) or past it, in the middle of a part (its whitespace is kept).
    pub fn resumed(inside: bool) -> Self {
        ReasoningSplit {
            at: if inside {
                Where::Reasoning
            } else {
                Where::Content
            },
            held: String::new(),
            harmony: None,
        }
    }

    /// [`resumed`](Self::resumed) for harmony messages, inside the analysis message
    /// (`inside`) or the final one.
    pub fn harmony_resumed(inside: bool) -> Self {
        ReasoningSplit {
            harmony: Some(Harmony::resumed(inside)),
            ..Self::resumed(inside)
        }
    }

    /// True while the answer is inside its thinking block.
    pub fn in_reasoning(&self) -> bool {
        match &self.harmony {
            Some(h) => h.in_analysis(),
            None => matches!(self.at, Where::OpenedFresh | Where::Reasoning),
        }
    }

    /// True until the answer proper starts, which is where a grammar applies: inside the
    /// thinking block, or in harmony every message and header before the final message's
    /// body (the model writes them, the grammar shapes the answer).
    pub fn before_answer(&self) -> bool {
        match &self.harmony {
            Some(h) => !h.in_answer(),
            None => self.in_reasoning(),
        }
    }

    /// The text that closes the thinking block where the answer is in it: `</think>`, or in
    /// harmony the analysis message's end and the final message's start.
    pub fn closing(&self) -> &'static str {
        match self.harmony {
            Some(_) => CLOSE_ANALYSIS,
            None => CLOSE_THINK,
        }
    }

    /// Harmony's pieces as parts: a call's arguments (a model that calls a function no one
    /// offered) are kept as content, not lost.
    fn harmony_parts(raw: Vec<Raw>) -> Parts {
        let mut out = Parts::default();
        for r in raw {
            match r {
                Raw::Reasoning(t) => out.reasoning.push_str(&t),
                Raw::Content(t) | Raw::Arguments(t) => out.content.push_str(&t),
                Raw::Call(_) => {}
            }
        }
        out
    }

    /// Follows the answer through `text`, the next piece of it.
    pub fn push(&mut self, text: &str) -> Parts {
        if let Some(h) = &mut self.harmony {
            let mut raw = Vec::new();
            h.push(text, &mut raw);
            return Self::harmony_parts(raw);
        }
        let mut out = Parts::default();
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        while !buf.is_empty() {
            match self.at {
                Where::Start => {
                    let rest = buf.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        buf = after.to_string();
                        self.at = Where::OpenedFresh;
                    } else if OPEN.starts_with(rest) {
                        // Whitespace, or the start of `<think>`: wait for more.
                        self.held = buf;
                        return out;
                    } else {
                        self.at = Where::Content;
                    }
                }
                Where::OpenedFresh | Where::ClosedFresh => {
                    let rest = buf.trim_start();
                    if rest.is_empty() {
                        return out;
                    }
                    buf = rest.to_string();
                    self.at = match self.at {
                        Where::OpenedFresh => Where::Reasoning,
                        _ => Where::Content,
                    };
                }
                Where::Reasoning => match buf.find(CLOSE) {
                    Some(i) => {
                        out.reasoning.push_str(&buf[..i]);
                        buf = buf[i + CLOSE.len()..].to_string();
                        self.at = Where::ClosedFresh;
                    }
                    None => {
                        let keep = partial_marker(&buf, CLOSE);
                        self.held = buf.split_off(buf.len() - keep);
                        out.reasoning.push_str(&buf);
                        return out;
                    }
                },
                Where::Content => {
                    out.content.push_str(&buf);
                    return out;
                }
            }
        }
        out
    }

    /// The end of the answer: what was held back, in the part it was in.
    pub fn flush(&mut self) -> Parts {
        if let Some(h) = &mut self.harmony {
            let mut raw = Vec::new();
            h.finish(&mut raw);
            return Self::harmony_parts(raw);
        }
        let held = std::mem::take(&mut self.held);
        match self.at {
            Where::Reasoning | Where::OpenedFresh => Parts {
                reasoning: held,
                ..Parts::default()
            },
            // Whitespace before a block that never came, or an unfinished `<thi`: content.
            _ => Parts {
                content: held,
                ..Parts::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` pushed in two pieces cut at every byte boundary (and whole), flushed: every cut
    /// gives the same parts.
    fn split_everywhere(text: &str, inside: bool) -> Parts {
        let whole = {
            let mut s = ReasoningSplit::new(inside);
            let mut p = s.push(text);
            p.append(s.flush());
            p
        };
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut s = ReasoningSplit::new(inside);
            let mut p = Parts::default();
            for piece in [&text[..cut], &text[cut..]] {
                p.append(s.push(piece));
            }
            p.append(s.flush());
            assert_eq!(p, whole, "cut at {cut} of {text:?}");
        }
        // And one character at a time, as byte tokens give it.
        let mut s = ReasoningSplit::new(inside);
        let mut p = Parts::default();
        for ch in text.chars() {
            p.append(s.push(ch.encode_utf8(&mut [0; 4])));
        }
        p.append(s.flush());
        assert_eq!(p, whole, "char by char: {text:?}");
        whole
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_qwen3_answer_splits_at_its_block() {
        let text = "<think>\nThe user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of France is **Paris**.";
        assert_eq!(
            split_everywhere(text, false),
            parts(
                "The user asks for the capital of France. That is Paris.\n",
                "The capital of France is **Paris**."
            )
        );
    }

    #[test]
    fn a_deepseek_answer_whose_template_opened_the_block() {
        let text = "Okay, 17 × 3: 10 × 3 = 30, 7 × 3 = 21, so 51.\n</think>\n\n17 × 3 = **51**.";
        assert_eq!(
            split_everywhere(text, true),
            parts(
                "Okay, 17 × 3: 10 × 3 = 30, 7 × 3 = 21, so 51.\n",
                "17 × 3 = **51**."
            )
        );
    }

    #[test]
    fn a_continued_answer_goes_on_in_the_part_it_stopped_in() {
        // Mid-thought: the space before the next word is kept, the block still closes.
        let mut s = ReasoningSplit::resumed(true);
        let mut p = s.push(" so 51.\n</thi");
        p.append(s.push("nk>\n\nIt is 51."));
        p.append(s.flush());
        assert_eq!(p, parts(" so 51.\n", "It is 51."));
        // Past the block: a marker in the rest of the answer is content.
        let mut s = ReasoningSplit::resumed(false);
        let mut p = s.push(" <think>more</think>");
        p.append(s.flush());
        assert_eq!(p, parts("", " <think>more</think>"));
    }

    #[test]
    fn an_empty_block_and_thinking_turned_off() {
        // Qwen3 with enable_thinking false: the template writes an empty block itself, and
        // the model answers after it; a model that skips the block answers in content.
        assert_eq!(
            split_everywhere("<think>\n\n</think>\n\nParis.", false),
            parts("", "Paris.")
        );
        assert_eq!(split_everywhere("Paris.", false), parts("", "Paris."));
        assert_eq!(
            split_everywhere("  Paris <b>", false),
            parts("", "  Paris <b>")
        );
    }

    #[test]
    fn only_a_block_at_the_start_is_reasoning() {
        let text = "Use <think> tags like <think>this</think> in HTML-ish markup.";
        assert_eq!(split_everywhere(text, false), parts("", text));
        // A second block after the first is content too.
        assert_eq!(
            split_everywhere("<think>a</think>b <think>c</think>", false),
            parts("a", "b <think>c</think>")
        );
    }

    /// A harmony answer pushed in two pieces cut at every character boundary, flushed.
    fn harmony_everywhere(text: &str) -> Parts {
        let whole = {
            let mut s = ReasoningSplit::harmony();
            let mut p = s.push(text);
            p.append(s.flush());
            p
        };
        for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut s = ReasoningSplit::harmony();
            let mut p = s.push(&text[..cut]);
            p.append(s.push(&text[cut..]));
            p.append(s.flush());
            assert_eq!(p, whole, "cut at {cut} of {text:?}");
        }
        whole
    }

    #[test]
    fn harmony_messages_split_by_their_channels() {
        let text = "<|channel|>analysis<|message|>User asks 17 × 3. 10 × 3 + 7 × 3 = 51.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>17 × 3 = **51**.";
        assert_eq!(
            harmony_everywhere(text),
            parts("User asks 17 × 3. 10 × 3 + 7 × 3 = 51.", "17 × 3 = **51**.")
        );
        // Header markup a model writes inside a message (a random test model does) is
        // dropped, never shown as text.
        assert_eq!(
            harmony_everywhere(
                "<|channel|>analysis<|message|>Hm<|channel|> ok<|end|>\
                 <|start|>assistant<|channel|>final<|message|>Pa<|message|>ris<|constrain|>."
            ),
            parts("Hm ok", "Paris.")
        );
        // No analysis: all content; a cut answer inside its analysis: all reasoning.
        assert_eq!(
            harmony_everywhere("<|channel|>final<|message|>Paris."),
            parts("", "Paris.")
        );
        assert_eq!(
            harmony_everywhere("<|channel|>analysis<|message|>Thinking about Par"),
            parts("Thinking about Par", "")
        );
        // Where the answer is, for a thinking budget, and what closes the analysis.
        let mut s = ReasoningSplit::harmony();
        assert!(!s.in_reasoning());
        s.push("<|channel|>analysis<|message|>Hm");
        assert!(s.in_reasoning());
        let closing = s.closing();
        let p = s.push(closing);
        assert!(!s.in_reasoning() && p == parts("", ""), "{p:?}");
        assert_eq!(s.push("Paris."), parts("", "Paris."));
        assert_eq!(ReasoningSplit::new(false).closing(), "\n</think>\n\n");
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning_and_a_partial_marker_is_released() {
        assert_eq!(
            split_everywhere("<think>\nstill thinking </thi", false),
            parts("still thinking </thi", "")
        );
        assert_eq!(split_everywhere("<thi", false), parts("", "<thi"));
        assert_eq!(split_everywhere("   ", false), parts("", "   "));
        assert_eq!(
            split_everywhere("über </think>fin", true),
            parts("über ", "fin")
        );
    }
}
