//! Speculative decoding inside the flow (issue 17): something cheap proposes an answer's next
//! few tokens, and the model checks them all in one pass of 1 + k rows, the answer's last token
//! and the draft. The rows go through the same step as every other answer's, so verification
//! rows are simply more rows in a round.
//!
//! The check draws each position's token from the model's own logits, in order, with the
//! sequence's own sampler (its seed, penalties, grammar, stop strings, live settings), exactly as
//! plain decoding would, and keeps going while the draft proposed that very token. A row's
//! logits do not depend on the rows beside it, so every token is the one plain decoding would
//! have drawn, bit for bit, greedy or sampled: the text is the same, only sooner. (Against a
//! proposal that is a single token, drawing from the model and comparing is the standard
//! acceptance rule: accept with probability p(draft), else draw from p without it.) What the
//! draft got wrong is cut from the cache.
//!
//! Proposals come from [`lookup`]: the continuation of the latest earlier occurrence of the
//! answer's last few tokens in the prompt and the answer so far (llama.cpp's prompt lookup),
//! or from a draft model (`draft.rs`): a smaller model of the same vocabulary, with its own
//! cache beside the answer's, whose greedy continuation is the proposal. (A greedy draft is a
//! single token per position, so the check above stays the standard rule.) [`Drafter`] adapts
//! how many tokens it proposes: more while drafts are accepted, fewer when they are not, and
//! none for a while after misses, so a text that repeats nothing costs almost nothing. What
//! drafts cost the machine is weighed per pass, for all answers together (`weigh.rs`): the
//! worker tells each answer how many tokens it may propose this step.

use super::Sequence;
use crate::error::Result;
use crate::model::KvCache;
use crate::request::Speculation;
use crate::tokenizer::Tokenizer;
use crate::weigh::Verdict;

/// The longest suffix matched, and the shortest worth a proposal.
const MAX_NGRAM: usize = 4;
const MIN_NGRAM: usize = 2;
/// Draft lengths: the first, and the most (well inside the cache's rollback).
const FIRST_K: usize = 4;
const MAX_K: usize = 8;
/// Steps without proposals after two misses in a row, doubling up to the most.
const FIRST_BACKOFF: usize = 4;
const MAX_BACKOFF: usize = 64;
/// Steps without proposals after its drafts proved to cost the machine (`weigh.rs`), four
/// times longer each time, and after the longest none for the rest of the answer: a draft
/// model reads every token it missed before it drafts again, so each resumption costs as much
/// as the pause was long, and only not resuming saves that.
const FIRST_SLOW_PAUSE: usize = 4;
const MAX_SLOW_PAUSE: usize = 256;
/// A draft model that resumes after a pause reads only this many of the answer's latest
/// tokens (the whole prompt it always reads): what comes next depends mostly on them, and
/// reading every missed token would cost as much as the pause was long.
const RESUME_WINDOW: usize = 16;

/// Up to `k` tokens that followed the latest earlier occurrence of the last `n` tokens of
/// `tokens` (the longest `n` from [`MAX_NGRAM`] down to [`MIN_NGRAM`] that occurs).
pub(crate) fn lookup(tokens: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM).rev() {
        if tokens.len() <= n {
            continue;
        }
        let tail = &tokens[tokens.len() - n..];
        // The latest occurrence that ends before the tail and has a token after it.
        let found = (0..tokens.len() - n)
            .rev()
            .find(|&i| &tokens[i..i + n] == tail);
        if let Some(i) = found {
            let from = i + n;
            let to = (from + k).min(tokens.len());
            // An image's rows are not tokens to propose: the draft ends before them.
            return tokens[from..to]
                .iter()
                .copied()
                .take_while(|&t| t < crate::message::IMAGE_PLACEHOLDER)
                .collect();
        }
    }
    Vec::new()
}

/// Where a draft model that has read up to `held` of `len` tokens reads on: there, or, once
/// it has read the prompt (`prompt_len`) and is more than [`RESUME_WINDOW`] behind, at the
/// window's start.
fn draft_reads_from(held: usize, prompt_len: usize, len: usize) -> usize {
    let window = len.saturating_sub(RESUME_WINDOW);
    match held >= prompt_len && window > held {
        true => window,
        false => held.min(len),
    }
}

/// One answer's proposer, with its counts.
#[derive(Clone, Debug)]
pub(crate) struct Drafter {
    kind: Speculation,
    k: usize,
    /// Steps left without proposals, after misses.
    pause: usize,
    backoff: usize,
    misses: usize,
    /// The pause the next verdict of "slower" gives.
    slow_pause: usize,
    pub proposed: usize,
    pub accepted: usize,
}

impl Drafter {
    pub fn new(kind: Speculation) -> Option<Self> {
        (kind != Speculation::Off).then_some(Drafter {
            kind,
            k: FIRST_K,
            pause: 0,
            backoff: FIRST_BACKOFF,
            misses: 0,
            slow_pause: FIRST_SLOW_PAUSE,
            proposed: 0,
            accepted: 0,
        })
    }

    /// Whether this step may propose: not while paused after misses.
    fn turn(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Its drafts cost the machine more than they gave: none for a while, longer each time,
    /// then none at all.
    fn slower(&mut self) {
        self.pause = self.pause.max(self.slow_pause);
        self.slow_pause = match self.slow_pause {
            p if p >= MAX_SLOW_PAUSE => usize::MAX,
            p => p * 4,
        };
    }

    /// How likely its drafts are to be taken, from its counts so far (a fresh one is even).
    pub fn acceptance(&self) -> f64 {
        (self.accepted as f64 + 1.0) / (self.proposed as f64 + 2.0)
    }

    /// A draft of at most `room` tokens after `tokens`.
    fn propose(&mut self, tokens: &[u32], room: usize) -> Vec<u32> {
        if self.kind == Speculation::Draft || !self.turn() {
            return Vec::new();
        }
        match self.kind {
            // A draft model's proposal is made by the worker's draft passes (`draft.rs`).
            Speculation::Off | Speculation::Draft => Vec::new(),
            Speculation::Lookup => lookup(tokens, self.k.min(room)),
            Speculation::Contrary => vec![tokens.first().copied().unwrap_or(0); self.k.min(room)],
        }
    }

    /// How many tokens a draft model may propose now (0 while paused after misses).
    fn wanted(&mut self, room: usize) -> usize {
        // A pass with no room still counts as a step of a pause.
        if self.kind != Speculation::Draft || !self.turn() || room == 0 {
            return 0;
        }
        self.k.min(room)
    }

    /// How a check went: `accepted` of `proposed` draft tokens were the model's (counted
    /// as they came, in [`Sequence::check_draft`]).
    fn settle(&mut self, proposed: usize, accepted: usize) {
        if accepted == proposed {
            self.k = (self.k + 2).min(MAX_K);
        } else {
            self.k = (accepted + 1).max(2);
        }
        if accepted == 0 {
            self.misses += 1;
            if self.misses >= 2 {
                self.pause = self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                self.misses = 0;
            }
        } else {
            self.misses = 0;
            self.backoff = FIRST_BACKOFF;
        }
    }
}

impl Sequence {
    /// Before a step that draws (a decode step, or the chunk that ends the prompt): proposes
    /// this step's draft of at most `limit` tokens (the pass's weighing, `weigh.rs`), when the
    /// answer speculates. The draft never reaches past the answer's length limit or the
    /// context.
    pub fn prepare_draft(&mut self, limit: usize) {
        self.draft.clear();
        let room = self.draft_room().min(limit);
        if let Some(d) = self.drafter.as_mut() {
            self.draft = d.propose(&self.tokens, room);
        }
    }

    /// The most draft tokens this step may check: within the answer's length limit and the
    /// context.
    fn draft_room(&self) -> usize {
        let left = self
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.completion_tokens + 1));
        left.min(self.context_length.saturating_sub(self.tokens.len() + 1))
    }

    /// For a draft model's passes (`draft.rs`): how many tokens it should propose for this
    /// step (at most `limit`), 0 for none. Call after [`prepare_draft`](Self::prepare_draft).
    pub fn model_draft_wanted(&mut self, limit: usize) -> usize {
        let room = self.draft_room().min(limit);
        self.drafter.as_mut().map_or(0, |d| d.wanted(room))
    }

    /// The draft model's first input this step: the tokens its cache lacks (at most
    /// `chunk`), and whether that catches it up, so that its last row proposes.
    pub fn draft_catch_up(&mut self, chunk: usize) -> (&[u32], &mut KvCache, bool) {
        if self.draft_cache.len() + self.draft_skipped >= self.tokens.len() {
            // Never ahead of the tokens (only after a failure); start over.
            self.draft_cache = KvCache::new();
            self.draft_skipped = 0;
        }
        let from = self.draft_next();
        self.draft_skipped = from - self.draft_cache.len();
        let to = self.tokens.len().min(from + chunk.max(1));
        let caught_up = to == self.tokens.len();
        (&self.tokens[from..to], &mut self.draft_cache, caught_up)
    }

    /// Where the draft model reads on in `tokens`: after what its cache holds, or, once it
    /// has read the prompt and fallen more than [`RESUME_WINDOW`] tokens behind (a pause),
    /// at the last of them, the ones between left out of its cache for good.
    fn draft_next(&self) -> usize {
        let held = self.draft_cache.len() + self.draft_skipped;
        draft_reads_from(held, self.prompt_len, self.tokens.len())
    }

    /// The tokens the draft model will read before it proposes.
    pub fn draft_lag(&self) -> &[u32] {
        &self.tokens[self.draft_next()..]
    }

    /// The draft model's next input: the token it proposed last.
    pub fn draft_continue(&mut self) -> (&[u32], &mut KvCache) {
        let n = self.draft.len();
        (&self.draft[n.saturating_sub(1)..], &mut self.draft_cache)
    }

    /// A token the draft model proposes for this step.
    pub fn push_draft(&mut self, id: u32) {
        self.draft.push(id);
    }

    /// Proposed tokens so far this step.
    pub fn draft_len(&self) -> usize {
        self.draft.len()
    }

    /// After a failed draft pass: the draft cache is not trusted any more, nor the proposal.
    pub fn reset_draft(&mut self) {
        self.draft_cache = KvCache::new();
        self.draft_skipped = 0;
        self.draft.clear();
    }

    /// The rows its next decode step will likely run: as many as its last one.
    pub fn expected_rows(&self) -> usize {
        self.last_rows
    }

    /// The rows whose logits the step needs: the draft's and the one before.
    pub fn logit_rows(&self) -> usize {
        1 + self.draft.len()
    }

    /// The rows of a verification step: the pending tokens (the last one drawn, or the end
    /// of the prompt), then the draft.
    pub(super) fn verify_input(&mut self) -> &[u32] {
        self.verify.clear();
        self.verify
            .extend_from_slice(&self.tokens[self.cache.len()..]);
        self.verify.extend_from_slice(&self.draft);
        &self.verify
    }

    /// After a verification step (`logits`: one row per position checked): draws each
    /// position's token as plain decoding would, while the draft proposed it, and cuts what
    /// the draft got wrong from the cache.
    pub(super) fn check_draft(&mut self, tok: &Tokenizer, logits: Vec<f32>) -> Result<()> {
        let draft = std::mem::take(&mut self.draft);
        let vocab = logits.len() / (draft.len() + 1);
        // The cache holds the tokens and the whole draft; the tokens end before the draft.
        let base = self.tokens.len();
        if let Some(d) = self.drafter.as_mut() {
            d.proposed += draft.len();
        }
        let mut accepted = 0;
        let mut result = Ok(());
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            let mut row = row.to_vec();
            let before = self.tokens.len();
            result = self.sample_and_emit(tok, &mut row, draft.get(i).copied());
            let drew = (self.tokens.len() == before + 1).then(|| self.tokens[before]);
            let agrees = i < draft.len() && drew == Some(draft[i]);
            if agrees {
                accepted += 1;
                if let Some(d) = self.drafter.as_mut() {
                    d.accepted += 1;
                }
            }
            if result.is_err() || self.finished.is_some() || !agrees {
                break;
            }
        }
        // Whatever happened, the cache holds no more than the tokens it ran. A draft model's
        // cache holds the tokens (less those it skipped), then the proposal but its last:
        // what it got right stays.
        self.cache
            .truncate((base + accepted).min(self.tokens.len()));
        let kept = (base + accepted).min(self.tokens.len());
        let kept_draft = kept.saturating_sub(self.draft_skipped);
        if self.draft_cache.len() > kept_draft {
            self.draft_cache.truncate(kept_draft);
        }
        if let Some(d) = self.drafter.as_mut() {
            d.settle(draft.len(), accepted);
        }
        result
    }

    /// Whether it speculates, and how likely its drafts are to be taken (for the order in
    /// which a pass's draft tokens are handed out).
    pub fn speculates(&self) -> Option<f64> {
        self.drafter.as_ref().map(Drafter::acceptance)
    }

    /// The pass-level weighing's verdict on a pass it speculated in (`weigh.rs`): drafts
    /// that cost the machine pause (4, 16, 64, 256 steps, then for the rest of the answer);
    /// drafts that pay reset that.
    pub fn weighed(&mut self, verdict: &Verdict) {
        if let Some(d) = self.drafter.as_mut() {
            match verdict {
                Verdict::Slower => d.slower(),
                Verdict::Pay => d.slow_pause = FIRST_SLOW_PAUSE,
                Verdict::Crowding => {}
            }
        }
    }

    /// Draft tokens (proposed, accepted) so far.
    pub fn draft_counts(&self) -> (usize, usize) {
        self.drafter
            .as_ref()
            .map_or((0, 0), |d| (d.proposed, d.accepted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // "a b c d" earlier, then "x b c" again: the 2-gram "b c" matches, "d e" followed.
        let t = [1, 2, 3, 4, 5, 9, 2, 3];
        assert_eq!(lookup(&t, 2), [4, 5]);
        assert_eq!(lookup(&t, 10), [4, 5, 9, 2, 3]);
        // The latest occurrence wins; a longer suffix wins over a shorter one.
        let t = [7, 8, 1, 7, 8, 2, 6, 7, 8];
        assert_eq!(lookup(&t, 1), [2]);
        let t = [5, 7, 8, 3, 6, 7, 8, 4, 5, 7, 8];
        assert_eq!(lookup(&t, 1), [3]);
        // Nothing repeats: no proposal.
        assert!(lookup(&[1, 2, 3, 4], 4).is_empty());
        assert!(lookup(&[1, 2], 4).is_empty());
        assert!(lookup(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn a_draft_model_reads_the_whole_prompt_but_only_the_latest_tokens_after_a_pause() {
        let w = RESUME_WINDOW;
        // The prompt (100 tokens), even in chunks: every token.
        assert_eq!(draft_reads_from(0, 100, 100), 0);
        assert_eq!(draft_reads_from(40, 100, 100), 40);
        // Caught up, or a few behind (a check's accepted tokens): on from where it is.
        assert_eq!(draft_reads_from(100, 100, 101), 100);
        assert_eq!(draft_reads_from(100, 100, 100 + w), 100);
        // After a pause of 64 steps: the last window only.
        assert_eq!(draft_reads_from(120, 100, 184), 184 - w);
        // The prompt's own tail is never skipped, however long the answer since.
        assert_eq!(draft_reads_from(90, 100, 300), 90);
    }

    #[test]
    fn the_draft_grows_while_accepted_and_pauses_after_misses() {
        let mut d = Drafter::new(Speculation::Lookup).unwrap();
        d.proposed = 15;
        d.accepted = 6;
        d.settle(4, 4);
        assert_eq!(d.k, 6);
        d.settle(6, 2);
        assert_eq!(d.k, 3);
        d.settle(3, 0);
        d.settle(2, 0);
        assert_eq!(d.pause, FIRST_BACKOFF);
        let repeat = [1, 2, 3, 1, 2];
        for _ in 0..FIRST_BACKOFF {
            assert!(d.propose(&repeat, 8).is_empty());
        }
        assert_eq!(d.propose(&repeat, 8), [3, 1]);
        assert_eq!((d.proposed, d.accepted), (15, 6));
        assert!(Drafter::new(Speculation::Off).is_none());
    }

    #[test]
    fn drafts_that_cost_the_machine_pause_longer_each_time_until_they_pay() {
        let mut d = Drafter::new(Speculation::Lookup).unwrap();
        let paused = |d: &mut Drafter| (0..2000).take_while(|_| !d.turn()).count();
        d.slower();
        assert_eq!(paused(&mut d), FIRST_SLOW_PAUSE);
        d.slower();
        assert_eq!(paused(&mut d), FIRST_SLOW_PAUSE * 4);
        d.slower();
        d.slower();
        assert_eq!(paused(&mut d), MAX_SLOW_PAUSE);
        // After the longest pause, none for the rest of the answer.
        d.slower();
        assert_eq!(paused(&mut d), 2000);
        // A new answer's drafter, or drafts that paid: the next pause is short again.
        let mut d = Drafter::new(Speculation::Lookup).unwrap();
        d.slower();
        d.slow_pause = FIRST_SLOW_PAUSE;
        assert_eq!(paused(&mut d), FIRST_SLOW_PAUSE);
        d.slower();
        assert_eq!(paused(&mut d), FIRST_SLOW_PAUSE);
    }
}
