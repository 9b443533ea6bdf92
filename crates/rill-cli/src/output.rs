//! How `run` and `chat` print an answer, and their thinking flags.
//!
//! Plain text is the answer as the model wrote it: a thinking model's reasoning comes first,
//! between `<think>` and `</think>`, then its content. `--json` prints one object per line:
//! `token` events (with `reasoning` for a token inside the thinking block), then `done`, whose
//! usage counts the reasoning's tokens. `--think on|off` sets the template's `enable_thinking`
//! (Qwen3); `--thinking-budget N` closes the block after N tokens.

use std::io::Write;

use anyhow::{bail, Result};
use clap::Args;
use rill_engine::{ChatArgs, Event};

/// A thinking model's switch and budget.
#[derive(Args, Clone, Default)]
pub struct ThinkArgs {
    /// Let a model whose template has a thinking switch (Qwen3) think first: on or off
    /// (default: the template's own).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub think: Option<bool>,
    /// Close a thinking model's block after this many tokens; it answers after them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub thinking_budget: Option<u64>,
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("`{s}`: say on or off")),
    }
}

impl ThinkArgs {
    /// The template variables the flags set.
    pub fn chat(&self) -> ChatArgs {
        let mut chat = ChatArgs::default();
        if let Some(on) = self.think {
            chat.kwargs.insert("enable_thinking".into(), on.into());
        }
        chat
    }

    pub fn budget(&self) -> Option<usize> {
        self.thinking_budget.map(|b| b as usize)
    }
}

/// Prints one answer's events as they come.
#[derive(Default)]
pub struct Printer {
    json: bool,
    /// Plain text: inside the `<think>` block written so far, and whether what it wrote last
    /// ended a line.
    thinking: bool,
    line_ended: bool,
}

impl Printer {
    pub fn new(json: bool) -> Self {
        Printer {
            json,
            ..Default::default()
        }
    }

    pub fn print(&mut self, out: &mut impl Write, event: &Event) -> std::io::Result<()> {
        match event {
            Event::Token {
                id,
                text,
                reasoning,
                drafted,
                ..
            } if self.json => {
                let mut line = serde_json::json!({"event": "token", "id": id, "text": text});
                if !reasoning.is_empty() {
                    line["reasoning"] = reasoning.as_str().into();
                }
                if *drafted {
                    line["drafted"] = true.into();
                }
                writeln!(out, "{line}")?
            }
            Event::Token {
                text, reasoning, ..
            } => {
                if !reasoning.is_empty() {
                    if !self.thinking {
                        writeln!(out, "<think>")?;
                        self.thinking = true;
                    }
                    write!(out, "{reasoning}")?;
                    self.line_ended = reasoning.ends_with('\n');
                }
                if !text.is_empty() {
                    self.close_block(out)?;
                    write!(out, "{text}")?;
                }
            }
            Event::Done {
                reason,
                usage,
                timings,
            } if self.json => writeln!(
                out,
                "{}",
                serde_json::json!({"event": "done", "reason": reason, "usage": usage, "timings": timings})
            )?,
            Event::Done { .. } => {
                self.close_block(out)?;
                writeln!(out)?
            }
            _ => return Ok(()),
        }
        out.flush()
    }

    fn close_block(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if std::mem::take(&mut self.thinking) {
            let newline = if self.line_ended { "" } else { "\n" };
            write!(out, "{newline}</think>\n\n")?;
        }
        Ok(())
    }
}

/// Streams one generation to stdout; returns the answer's content.
pub fn stream(gen: rill_engine::Generation, json: bool) -> Result<String> {
    let mut out = std::io::stdout().lock();
    let mut printer = Printer::new(json);
    let mut answer = String::new();
    for event in gen {
        printer.print(&mut out, &event)?;
        match event {
            Event::Token { text, .. } => answer.push_str(&text),
            Event::Done { .. } => return Ok(answer),
            Event::Error { message } => bail!("{message}"),
            Event::Queued { .. } | Event::Started { .. } | Event::Stats { .. } => {}
        }
    }
    bail!("the engine stopped before the answer ended")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_engine::{StopReason, Timings, Usage};

    fn token(text: &str, reasoning: &str) -> Event {
        Event::Token {
            id: 1,
            text: text.into(),
            reasoning: reasoning.into(),
            candidates: Vec::new(),
            drafted: false,
        }
    }

    fn done() -> Event {
        Event::Done {
            reason: StopReason::Stop,
            usage: Usage::default(),
            timings: Timings::default(),
        }
    }

    fn printed(json: bool, events: &[Event]) -> String {
        let mut out = Vec::new();
        let mut p = Printer::new(json);
        for e in events {
            p.print(&mut out, e).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn plain_text_writes_the_block_back_around_the_reasoning() {
        let events = [
            token("", "17 × 3"),
            token("", " is 51.\n"),
            token("51.", ""),
            done(),
        ];
        assert_eq!(
            printed(false, &events),
            "<think>\n17 × 3 is 51.\n</think>\n\n51.\n"
        );
        // A block cut by the end is closed; an answer without one is printed as it is.
        assert_eq!(
            printed(false, &[token("", "hmm"), done()]),
            "<think>\nhmm\n</think>\n\n\n"
        );
        assert_eq!(printed(false, &[token("Hi", ""), done()]), "Hi\n");
    }

    #[test]
    fn json_tokens_carry_their_reasoning_apart() {
        let lines = printed(true, &[token("", "hmm"), token("Hi", "")]);
        let lines: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["reasoning"], "hmm");
        assert_eq!(lines[0]["text"], "");
        assert_eq!(lines[1]["text"], "Hi");
        assert!(lines[1].get("reasoning").is_none());
    }
}
