//! A thinking model's answer as the store keeps it: how long it thought ([`Thinking`]), and
//! the prompt that continues a partial answer with its thinking block written back around its
//! reasoning ([`continued`]).

use std::time::Instant;

/// How long an answer thinks: from its first reasoning to the first content after it (or the
/// answer's end), added to what an answer being continued had thought already; and how many
/// tokens of reasoning that one had.
#[derive(Clone, Debug, Default)]
pub(crate) struct Thinking {
    pub(crate) before_tokens: usize,
    before_ms: f64,
    since: Option<Instant>,
    /// Set once the reasoning is over.
    pub(crate) ms: Option<f64>,
}

impl Thinking {
    pub(crate) fn continuing(before_ms: Option<f64>, before_tokens: usize) -> Self {
        Thinking {
            before_tokens,
            before_ms: before_ms.unwrap_or(0.0),
            ms: before_ms,
            since: None,
        }
    }

    pub(crate) fn see(&mut self, reasoning: &str, content: &str) {
        if !reasoning.is_empty() && self.since.is_none() {
            self.since = Some(Instant::now());
        }
        if !content.is_empty() {
            self.end();
        }
    }

    pub(crate) fn end(&mut self) {
        if let Some(since) = self.since.take() {
            self.ms = Some(self.before_ms + since.elapsed().as_secs_f64() * 1000.0);
        }
    }
}

/// The prompt that continues a partial answer after `opened` (the rendered conversation, its
/// assistant turn opened), and whether the answer stopped inside its thinking block. Under
/// harmony (gpt-oss), the reasoning goes back as its analysis message and the content as its
/// final one.
pub(crate) fn continued(opened: &str, reasoning: &str, content: &str) -> (String, bool) {
    use rill_engine::reasoning::{CLOSE, HARMONY_ANALYSIS, HARMONY_FINAL, HARMONY_TURN, OPEN};
    if opened.ends_with(HARMONY_TURN) {
        let mut prompt = opened.to_owned();
        if !reasoning.is_empty() {
            prompt.push_str(HARMONY_ANALYSIS);
            prompt.push_str(reasoning);
            if content.is_empty() {
                return (prompt, true);
            }
            prompt.push_str("<|end|>");
            prompt.push_str(HARMONY_TURN);
        }
        if !content.is_empty() {
            prompt.push_str(HARMONY_FINAL);
            prompt.push_str(content);
        }
        return (prompt, false);
    }
    let template_opened = opened.trim_end().ends_with(OPEN);
    if reasoning.is_empty() && !template_opened {
        return (format!("{opened}{content}"), false);
    }
    let mut prompt = opened.to_owned();
    if !template_opened {
        prompt.push_str(OPEN);
        prompt.push('\n');
    }
    prompt.push_str(reasoning);
    if content.is_empty() {
        return (prompt, true);
    }
    if !prompt.ends_with('\n') {
        prompt.push('\n');
    }
    prompt.push_str(CLOSE);
    prompt.push_str("\n\n");
    prompt.push_str(content);
    (prompt, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_answer_is_continued_in_the_part_it_stopped_in() {
        // The template opened the block; the answer stopped while thinking.
        let opened = "<|Assistant|><think>\n";
        assert_eq!(
            continued(opened, "10 × 3 is 30,", ""),
            (format!("{opened}10 × 3 is 30,"), true)
        );
        // Past the block: it is written back closed, the content after it.
        assert_eq!(
            continued(opened, "so 51.\n", "It is"),
            (format!("{opened}so 51.\n</think>\n\nIt is"), false)
        );
        // A template that leaves the block to the model (Qwen3): the block is opened too.
        assert_eq!(
            continued("<|im_start|>assistant\n", "hmm", ""),
            ("<|im_start|>assistant\n<think>\nhmm".to_owned(), true)
        );
        // No thinking at all: the text goes on as it was.
        assert_eq!(
            continued("<|im_start|>assistant\n", "", "Paris"),
            ("<|im_start|>assistant\nParis".to_owned(), false)
        );
    }

    #[test]
    fn a_partial_harmony_answer_is_continued_in_its_message() {
        let opened = "<|start|>user<|message|>17 × 3?<|end|><|start|>assistant";
        assert_eq!(
            continued(opened, "10 × 3 is 30,", ""),
            (
                format!("{opened}<|channel|>analysis<|message|>10 × 3 is 30,"),
                true
            )
        );
        assert_eq!(
            continued(opened, "so 51.", "It is"),
            (
                format!(
                    "{opened}<|channel|>analysis<|message|>so 51.<|end|><|start|>assistant\
                     <|channel|>final<|message|>It is"
                ),
                false
            )
        );
        assert_eq!(
            continued(opened, "", "Par"),
            (format!("{opened}<|channel|>final<|message|>Par"), false)
        );
    }
}
