//! Weighing what speculation costs the machine (issue 17). Check rows ride in the same passes
//! as every other answer's decode rows, so whether drafts pay is a property of the pass, not of
//! one answer: a pass that checks a draft takes longer, for every answer in it.
//!
//! The [`Weigher`] keeps, for each number of answers decoding together, what a pass costs and
//! yields with drafts and without. Every few passes one runs with no drafts at all (a probe),
//! and the others may check at most [`Slot::cap`] draft tokens between them. After the first
//! two drafted passes, each one decides:
//! - tokens per millisecond, all answers together, fell below 95% of the plain passes': the
//!   machine's total throughput is lower with drafts, so the answers that drafted in the pass
//!   pause their drafts (4, 16, 64, 256 steps, then for the rest of the answer; `Drafter`: a
//!   draft model must read every token it missed before it drafts again, so only not
//!   resuming saves that). The pause is the answer's, so it holds when other answers come or
//!   go, and a new answer gets its chance;
//! - an answer that does not speculate sees each token more than 5% later than in plain
//!   passes: the others' check rows cost it its share of the machine, so the cap halves (and
//!   drafting pauses where it is down to one token). Answers that speculate are weighed
//!   together, by the first rule: one whose proposer finds nothing for a while gives up a
//!   little speed to those whose drafts are taken, as long as the machine draws more;
//! - otherwise the cap doubles (from two tokens per answer, up to eight), so that learning
//!   what a draft costs costs little where it does not pay.
//!
//! The worker gives the cap to the answers whose drafts were accepted most, first
//! (`worker.rs`). One answer alone is the same weighing: its speed with drafts against without.

/// Every this many passes one runs plain, to measure the passes without drafts.
const PROBE_EVERY: usize = 8;
/// Drafts must keep this share of the plain passes' speed, the machine's and a bystander's.
const MIN_SHARE: f64 = 0.95;
/// Drafted passes between decisions.
const DECIDE_EVERY: usize = 2;
/// The cap starts at this many tokens per answer (learning what drafts cost costs little),
/// doubles per decision that they pay, up to this many.
const FIRST_CAP_PER_ANSWER: usize = 2;
const CAP_PER_ANSWER: usize = 8;
/// Answer counts with figures of their own; more share the last slot.
const SLOTS: usize = 16;

/// A pass's cost and yield, smoothed.
#[derive(Clone, Copy, Debug)]
struct Figures {
    /// Tokens drawn per ms, all answers together.
    tokens_per_ms: f64,
    /// Milliseconds a pass takes.
    ms: f64,
}

impl Figures {
    fn update(old: Option<Figures>, tokens: usize, ms: f64) -> Option<Figures> {
        let now = Figures {
            tokens_per_ms: tokens as f64 / ms,
            ms,
        };
        Some(match old {
            None => now,
            Some(o) => Figures {
                tokens_per_ms: 0.7 * o.tokens_per_ms + 0.3 * now.tokens_per_ms,
                ms: 0.7 * o.ms + 0.3 * now.ms,
            },
        })
    }
}

/// The figures of passes with a given number of answers decoding.
#[derive(Clone, Debug)]
struct Slot {
    passes: usize,
    /// The most draft tokens one pass may check.
    cap: usize,
    plain: Option<Figures>,
    drafted: Option<Figures>,
    /// Drafted passes measured (up to the first decision), and whether one since the last
    /// decision had an answer that does not speculate.
    since: usize,
    bystander: bool,
}

/// What a slot's figures say of its drafts.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// The machine draws fewer tokens per ms with them: pause.
    Slower,
    /// They pay, but an answer that does not speculate pays for them: fewer.
    Crowding,
    /// They pay and cost nobody: more may come.
    Pay,
}

impl Slot {
    fn new(answers: usize) -> Self {
        Slot {
            passes: 0,
            cap: FIRST_CAP_PER_ANSWER * answers,
            plain: None,
            drafted: None,
            since: 0,
            bystander: false,
        }
    }

    fn decide(&mut self, answers: usize) -> Option<Verdict> {
        let (plain, drafted) = (self.plain?, self.drafted?);
        let bystander = std::mem::take(&mut self.bystander);
        tracing::debug!(
            answers,
            ?plain,
            ?drafted,
            bystander,
            cap = self.cap,
            "weighing drafts"
        );
        Some(if drafted.tokens_per_ms < MIN_SHARE * plain.tokens_per_ms {
            Verdict::Slower
        } else if bystander && MIN_SHARE * drafted.ms > plain.ms {
            if self.cap <= 1 {
                return Some(Verdict::Slower);
            }
            self.cap = (self.cap / 2).max(1);
            Verdict::Crowding
        } else {
            self.cap = (self.cap * 2).min(CAP_PER_ANSWER * answers);
            Verdict::Pay
        })
    }
}

/// What passes cost with drafts and without, by the number of answers decoding together.
#[derive(Debug)]
pub(crate) struct Weigher {
    slots: Vec<Slot>,
    /// Off: every pass may check as many draft tokens as the answers propose (tests of the
    /// checking path, which must not depend on this machine's speed).
    on: bool,
}

impl Weigher {
    pub(crate) fn new(on: bool) -> Self {
        Weigher {
            slots: Vec::new(),
            on,
        }
    }

    fn slot(&mut self, answers: usize) -> &mut Slot {
        let i = answers.clamp(1, SLOTS) - 1;
        while self.slots.len() <= i {
            let n = self.slots.len() + 1;
            self.slots.push(Slot::new(n));
        }
        &mut self.slots[i]
    }

    /// Before a pass of `answers` answers in which some speculate: the most draft tokens it
    /// may check between them (0: a plain pass, a probe or a pause). `measured`: the pass
    /// will be observed (only answers decoding in it); another pass (a prompt's chunk beside
    /// them) gets the cap, and counts towards no probe or pause.
    pub(crate) fn allow(&mut self, answers: usize, measured: bool) -> usize {
        if !self.on {
            return usize::MAX;
        }
        let slot = self.slot(answers);
        if !measured {
            return slot.cap;
        }
        slot.passes += 1;
        // The first pass of a slot is a probe too, so that plain figures come first.
        if slot.passes % PROBE_EVERY == 1 {
            return 0;
        }
        slot.cap
    }

    /// After such a pass (only the answers decoding, no prompt tokens in it): `drawn` tokens
    /// in `ms`; `drafted`: it checked drafts; `bystander`: an answer in it does not
    /// speculate. The verdict, when the pass decided one: the worker pauses the drafts of
    /// the pass's answers where they cost the machine (`Verdict::Slower`).
    #[must_use]
    pub(crate) fn observe(
        &mut self,
        answers: usize,
        drafted: bool,
        bystander: bool,
        drawn: usize,
        ms: f64,
    ) -> Option<Verdict> {
        tracing::trace!(answers, drafted, bystander, drawn, ms, "weighed pass");
        // A long pass is a stall (another process, a swap), not what the pass costs.
        if !self.on || drawn == 0 || !(ms > 0.0 && ms < 2000.0) {
            return None;
        }
        let slot = self.slot(answers);
        if !drafted {
            slot.plain = Figures::update(slot.plain, drawn, ms);
            return None;
        }
        slot.drafted = Figures::update(slot.drafted, drawn, ms);
        slot.bystander |= bystander;
        // After the first two, every drafted pass decides: the figures are smoothed, and one
        // pass after a pause is all it takes to see that drafts still cost more than they give
        // (measured anew, they would cost two passes after every pause).
        slot.since = (slot.since + 1).min(DECIDE_EVERY);
        if slot.since < DECIDE_EVERY {
            return None;
        }
        slot.decide(answers.clamp(1, SLOTS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `passes` passes of `answers` answers: a plain pass draws one token per answer in
    /// `plain_ms`; a drafted one draws `drafted.0` tokens in `drafted.1` ms. A `Slower` verdict
    /// pauses drafting for `pause` passes, as the answers' drafters would. Returns the caps
    /// allowed and the verdicts.
    fn run(
        w: &mut Weigher,
        answers: usize,
        passes: usize,
        plain_ms: f64,
        drafted: (usize, f64),
        bystander: bool,
    ) -> (Vec<usize>, Vec<Verdict>) {
        let (mut caps, mut verdicts, mut paused) = (Vec::new(), Vec::new(), 0);
        for _ in 0..passes {
            let mut cap = w.allow(answers, true);
            if paused > 0 {
                (paused, cap) = (paused - 1, 0);
            }
            let verdict = match cap {
                0 => w.observe(answers, false, false, answers, plain_ms),
                _ => w.observe(answers, true, bystander, drafted.0, drafted.1),
            };
            if verdict == Some(Verdict::Slower) {
                paused = 4;
            }
            caps.push(cap);
            verdicts.extend(verdict);
        }
        (caps, verdicts)
    }

    #[test]
    fn a_probe_comes_first_and_every_eighth_pass() {
        let mut w = Weigher::new(true);
        // Drafts that pay: two answers, 6 tokens in 12 ms against 2 in 8 ms.
        let (caps, verdicts) = run(&mut w, 2, 24, 8.0, (6, 12.0), false);
        let plain: Vec<usize> = (0..24).filter(|&i| caps[i] == 0).collect();
        assert_eq!(plain, [0, 8, 16]);
        // The cap starts small and doubles while drafts pay, up to 8 tokens an answer.
        assert_eq!(caps[1..5], [4, 4, 8, 16]);
        assert!(caps[5..].iter().all(|&c| c == 0 || c == 16), "{caps:?}");
        assert!(verdicts.iter().all(|v| *v == Verdict::Pay), "{verdicts:?}");
    }

    #[test]
    fn drafts_that_lower_the_machines_tokens_per_ms_are_found_slower() {
        let mut w = Weigher::new(true);
        // One answer: 2 tokens in 12 ms with drafts against 1 in 5 ms without (0.83x).
        let (_, verdicts) = run(&mut w, 1, 40, 5.0, (2, 12.0), false);
        assert!(
            !verdicts.is_empty() && verdicts.iter().all(|v| *v == Verdict::Slower),
            "{verdicts:?}"
        );
    }

    #[test]
    fn a_bystander_slowed_down_halves_the_cap_and_an_unharmed_one_lets_it_grow() {
        let mut w = Weigher::new(true);
        // Four answers; drafted passes draw more tokens per ms but take 30% longer, and an
        // answer in them does not speculate: its share falls, so the cap shrinks.
        let (caps, verdicts) = run(&mut w, 4, 4, 10.0, (8, 13.0), true);
        assert_eq!(caps, [0, 8, 8, 4]);
        assert!(
            verdicts.iter().all(|v| *v == Verdict::Crowding),
            "{verdicts:?}"
        );
        // The same passes with every answer drafting: nobody loses, the cap grows back.
        let before = w.slot(4).cap;
        run(&mut w, 4, 24, 10.0, (8, 13.0), false);
        assert!(w.slot(4).cap > before, "{} <= {before}", w.slot(4).cap);
        // Other answer counts keep figures of their own.
        assert!(w.slot(3).plain.is_none());
    }

    #[test]
    fn a_cap_of_one_that_still_slows_a_bystander_is_found_slower() {
        let mut w = Weigher::new(true);
        let (caps, verdicts) = run(&mut w, 2, 12, 10.0, (3, 12.0), true);
        assert!(caps.contains(&1), "{caps:?}");
        assert_eq!(verdicts.last(), Some(&Verdict::Slower), "{verdicts:?}");
    }

    #[test]
    fn off_it_allows_every_draft_and_decides_nothing() {
        let mut w = Weigher::new(false);
        let (caps, verdicts) = run(&mut w, 1, 20, 5.0, (2, 50.0), true);
        assert!(caps.iter().all(|&c| c == usize::MAX));
        assert!(verdicts.is_empty());
    }
}
