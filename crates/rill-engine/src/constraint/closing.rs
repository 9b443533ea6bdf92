//! Steering a JSON answer to close before its length limit.
//!
//! A grammar says what may come next, not how long the answer may grow: sampled at
//! temperature 1, a small model writes on inside a string until `max_tokens` cuts the object
//! open. So as the limit nears, the tokens that *end* something are favoured: inside a string,
//! its closing quote (alone, or followed only by `}` and `]`); outside, `}` or `]`, or,
//! where the grammar does not let the container close yet, with `,` (which ends a number and
//! moves on to what the schema still requires). The
//! answer's own bytes tell which of the two it is in (a small scan that knows JSON's quotes
//! and escapes).
//!
//! The push starts when half of the answer's budget is left (at least [`MIN_WINDOW`] tokens
//! before the limit) and grows to [`MAX_BIAS`] on the logit a quarter of the budget before
//! it, leaving room for what the schema still requires after a long string. It only reorders
//! what the grammar allows: the mask is applied first, and −∞ plus a bias stays −∞.

use std::sync::Arc;

use llguidance::toktrie::SimpleVob;

use crate::tokenizer::Tokenizer;

/// The push starts at most this many tokens before the limit, for small budgets.
const MIN_WINDOW: usize = 64;
/// Added to a closing token's logit at the limit itself.
const MAX_BIAS: f32 = 12.0;

/// The tokens that end a string (`"`, `"}`, …), a container (`}`, `]}`, …) or a value (`,`).
pub(crate) struct ClosingTokens {
    quote: SimpleVob,
    bracket: SimpleVob,
    comma: SimpleVob,
}

impl ClosingTokens {
    pub fn new(t: &Tokenizer) -> Self {
        let n = t.vocab_size();
        let (mut quote, mut bracket, mut comma) = (
            SimpleVob::alloc(n),
            SimpleVob::alloc(n),
            SimpleVob::alloc(n),
        );
        // Only pure closers: `",` or `},` would close one thing and open the next.
        let closes = |rest: &[u8]| rest.iter().all(|b| matches!(b, b'}' | b']'));
        for id in 0..n as u32 {
            match t.piece_bytes(id) {
                [b'"', rest @ ..] if closes(rest) => quote.allow_token(id),
                [b'}' | b']', rest @ ..] if closes(rest) => bracket.allow_token(id),
                [b',', ..] => comma.allow_token(id),
                _ => {}
            }
        }
        ClosingTokens {
            quote,
            bracket,
            comma,
        }
    }
}

/// Where a JSON text stands after the bytes so far: inside a string or not.
#[derive(Clone, Copy, Debug, Default)]
struct Scan {
    in_string: bool,
    escaped: bool,
}

impl Scan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.escaped {
                self.escaped = false;
            } else if self.in_string && b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = !self.in_string;
            }
        }
    }
}

/// The bias for an answer allowed `budget` tokens that may take `left` more: 0 until the
/// window (the second half of the budget, at least [`MIN_WINDOW`] tokens), then growing
/// linearly to [`MAX_BIAS`], which it reaches halfway through the window.
fn bias(budget: usize, left: usize) -> f32 {
    let window = (budget / 2).max(MIN_WINDOW);
    if left > window {
        return 0.0;
    }
    let pressure = 2.0 * (1.0 - left as f32 / (window as f32 + 1.0));
    MAX_BIAS * pressure.min(1.0)
}

/// One JSON answer's place in its text, and its push towards closing.
pub(crate) struct Closing {
    tokens: Arc<ClosingTokens>,
    tokenizer: Arc<Tokenizer>,
    scan: Scan,
    /// The most tokens the answer may take, as first seen (a later, larger cap raises it).
    budget: usize,
}

impl Closing {
    pub fn new(tokens: Arc<ClosingTokens>, tokenizer: Arc<Tokenizer>) -> Self {
        Closing {
            tokens,
            tokenizer,
            scan: Scan::default(),
            budget: 0,
        }
    }

    /// Follows the answer's text through a committed token.
    pub fn push(&mut self, id: u32) {
        self.scan.feed(self.tokenizer.piece_bytes(id));
    }

    /// Favours the allowed tokens that close what is open, for an answer that may take
    /// `left` more tokens.
    pub fn steer(&mut self, logits: &mut [f32], left: usize) {
        self.budget = self.budget.max(left);
        let bias = bias(self.budget, left);
        if bias == 0.0 {
            return;
        }
        // Inside a string, its end. Outside, a container that may close now closes; one that
        // may not (a required property, a minimum of items still to come) moves on to its
        // next item, which also ends a number.
        let t = &*self.tokens;
        let may_close = || {
            let mut any = false;
            t.bracket.iter_set_entries(|id| {
                any |= logits.get(id).is_some_and(|l| l.is_finite());
            });
            any
        };
        let set = if self.scan.in_string {
            &t.quote
        } else if may_close() {
            &t.bracket
        } else {
            &t.comma
        };
        set.iter_set_entries(|id| {
            if let Some(l) = logits.get_mut(id) {
                *l += bias;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_string_after(text: &str) -> bool {
        let mut scan = Scan::default();
        // Split anywhere, as tokens split a text.
        for cut in 0..=text.len() {
            let (a, b) = text.as_bytes().split_at(cut);
            let mut split = Scan::default();
            split.feed(a);
            split.feed(b);
            scan = split;
        }
        scan.in_string
    }

    #[test]
    fn quotes_and_escapes_are_followed_across_any_split() {
        assert!(!in_string_after(""));
        assert!(in_string_after(r#"{"a"#));
        assert!(!in_string_after(r#"{"a": "#));
        assert!(in_string_after(r#"{"a": "say \"hi"#));
        assert!(!in_string_after(r#"{"a": "say \"hi\"""#));
        assert!(in_string_after(r#"{"a": "back\\"#));
        assert!(!in_string_after(r#"{"a": "back\\""#));
    }

    #[test]
    fn the_push_starts_at_half_the_budget_and_is_full_at_a_quarter() {
        assert_eq!(bias(300, 300), 0.0);
        assert_eq!(bias(300, 151), 0.0);
        let (early, later) = (bias(300, 150), bias(300, 100));
        assert!(
            0.0 < early && early < later && later < MAX_BIAS,
            "{early} {later}"
        );
        assert_eq!(bias(300, 75), MAX_BIAS);
        assert_eq!(bias(300, 0), MAX_BIAS);
        // A small budget is pushed for its last MIN_WINDOW tokens.
        assert_eq!(bias(30, MIN_WINDOW + 1), 0.0);
        assert!(bias(30, MIN_WINDOW) > 0.0);
    }
}
