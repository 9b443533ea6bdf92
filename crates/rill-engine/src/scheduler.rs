//! The flow's policy: which sequences do what in the next round, and how much prompt a round
//! may carry.
//!
//! Pure code over views of the live sequences and measured pass times (docs/architecture.md, style
//! rule 8), so it is tested without a model. Each round, every decoding sequence gets `priority`
//! decode steps (1 by default, so all answers move together), and the prompts waiting to be
//! prefilled share a budget of tokens, oldest first. Paused and finished sequences get nothing, and
//! so do queued ones (admission, which needs memory accounting, is the engine's).
//!
//! The budget comes from a [`Pacer`]: with no answer streaming it is the whole configured
//! chunk; while answers stream it is what fits so that a round carrying prompt tokens takes at
//! most [`STALL`] times a round without them. A new prompt then costs the streaming answers a
//! bounded slowdown instead of a pause, and still makes progress every round. A short prompt
//! (by the measured cost of prompt tokens, at most [`SHORT_PROMPT_MS`]) goes in whole instead:
//! a quick question beside long answers gets its first token about as soon as alone.

/// What a sequence is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SequenceState {
    /// Waiting for KV-cache memory; `Event::Queued` tells its place.
    Queued,
    /// Its prompt is going through the model, chunk by chunk.
    Prefilling,
    /// It produces one token per step.
    Decoding,
    /// Parked with its cache; resumes exactly where it was.
    Paused,
    /// Done; its cache is freed at the end of the round.
    Finished,
}

/// What the scheduler sees of a sequence.
#[derive(Clone, Copy, Debug)]
pub struct SeqView {
    pub id: u64,
    pub state: SequenceState,
    /// Share of the machine: decode steps per round (≥ 1).
    pub priority: u8,
    /// Tokens not yet in the cache (the prompt, or a dropped cache being recomputed).
    pub prompt_left: usize,
}

/// One unit of work for the engine loop to execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Run the next `tokens` prompt tokens of sequence `id`.
    Prefill { id: u64, tokens: usize },
    /// Produce `steps` tokens for sequence `id`.
    Decode { id: u64, steps: usize },
}

/// Plans one round. Sequences appear in admission order: the prefill budget goes to the
/// oldest prompt first, and what it does not need to the next.
pub fn plan_round(seqs: &[SeqView], prefill_budget: usize) -> Vec<Work> {
    let mut work = Vec::with_capacity(seqs.len());
    let mut budget = prefill_budget;
    for p in seqs
        .iter()
        .filter(|s| s.state == SequenceState::Prefilling && s.prompt_left > 0)
    {
        if budget == 0 {
            break;
        }
        let tokens = p.prompt_left.min(budget);
        budget -= tokens;
        work.push(Work::Prefill { id: p.id, tokens });
    }
    work.extend(
        seqs.iter()
            .filter(|s| s.state == SequenceState::Decoding)
            .map(|s| Work::Decode {
                id: s.id,
                steps: s.priority.max(1) as usize,
            }),
    );
    work
}

/// How long a round that carries prompt tokens may take, as a multiple of a round of the same
/// streaming answers without them: the slowdown a new prompt may cause the answers streaming.
pub const STALL: f64 = 1.75;

/// The most a whole waiting prompt may add to a round while answers stream, by the pacer's
/// estimate: a short question's prompt then goes in at once, ahead of the [`STALL`] pacing, and
/// its first token comes about as soon as it would alone (issue 43); the streaming answers see
/// one round this much longer.
pub const SHORT_PROMPT_MS: f64 = 150.0;

/// Decode-row counts the pacer tells apart; larger batches share the last entry.
const MAX_ROWS: usize = 64;

/// Weight of a new measurement in the pacer's running averages.
const EMA: f64 = 0.3;

/// Learns what forward passes cost and sizes each round's prefill budget from it.
///
/// A pass is modelled as the cost of its decode rows (measured on passes without prompt tokens,
/// per number of decode rows) plus a cost per prompt token: what passes with prompt tokens took
/// beyond their decode rows' cost, summed, over the prompt tokens they carried, summed. Sums,
/// not a per-pass ratio: a pass's timing noise, divided by the one or two prompt tokens it
/// carried, would swamp the estimate, while in the sums it averages out. All are running
/// averages, so they follow the context growing and the machine's load.
#[derive(Clone, Debug)]
pub struct Pacer {
    chunk: usize,
    /// Milliseconds of a decode-only pass, by decode rows (index 0 unused); 0 = not measured.
    decode_ms: Vec<f64>,
    /// Running sums of what prompt tokens added to passes, and of those tokens.
    prompt_ms: f64,
    prompt_tokens: f64,
    /// Prompt tokens of the last pass that carried any: a budget at most doubles from it, so
    /// an estimate that says prompt tokens are free is tried on a few before it is believed.
    last_prompt: usize,
}

impl Pacer {
    /// `chunk`: the most prompt tokens one pass takes (the engine's configured prefill chunk).
    pub fn new(chunk: usize) -> Self {
        Pacer {
            chunk: chunk.max(1),
            decode_ms: vec![0.0; MAX_ROWS + 1],
            prompt_ms: 0.0,
            prompt_tokens: 0.0,
            last_prompt: 0,
        }
    }

    /// Prompt tokens the next round may carry beside `decode_rows` streaming rows.
    ///
    /// None streaming: the whole chunk. Streaming, before a decode-only pass of that size was
    /// measured: none, so this round measures it. Streaming, with no prompt token measured yet:
    /// one token. Otherwise what fits in `(STALL − 1)` decode passes, at least one token (every
    /// prompt keeps moving), at most twice the last pass's prompt tokens (and 4) and at most the
    /// chunk.
    pub fn prefill_budget(&self, decode_rows: usize) -> usize {
        if decode_rows == 0 {
            return self.chunk;
        }
        let decode = self.decode_ms[decode_rows.min(MAX_ROWS)];
        if decode == 0.0 {
            return 0;
        }
        if self.prompt_tokens == 0.0 {
            return 1;
        }
        let per_token = (self.prompt_ms / self.prompt_tokens).max(f64::MIN_POSITIVE);
        let fit = (STALL - 1.0) * decode / per_token;
        let ramp = (2 * self.last_prompt).max(4).min(self.chunk);
        (fit.min(ramp as f64) as usize).max(1)
    }

    /// Prompt tokens the next round may carry beside `decode_rows` streaming rows when the
    /// oldest waiting prompt has `next` tokens left, and whether that prompt goes in whole
    /// (ahead of the decode step): [`prefill_budget`](Self::prefill_budget), or all of `next`
    /// where the prompt tokens' measured cost puts them within [`SHORT_PROMPT_MS`] (and the
    /// chunk). Before any prompt token was measured, the paced budget.
    pub fn budget_for(&self, decode_rows: usize, next: usize) -> (usize, bool) {
        let paced = self.prefill_budget(decode_rows);
        if next <= paced || next > self.chunk || self.prompt_tokens == 0.0 {
            return (paced, false);
        }
        let per_token = self.prompt_ms / self.prompt_tokens;
        match per_token * next as f64 <= SHORT_PROMPT_MS {
            true => (next, true),
            false => (paced, false),
        }
    }

    /// Records a pass of `decode_rows` decode rows and `prompt_tokens` prompt tokens that took
    /// `ms` milliseconds.
    pub fn record(&mut self, decode_rows: usize, prompt_tokens: usize, ms: f64) {
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        let slot = decode_rows.min(MAX_ROWS);
        if prompt_tokens == 0 {
            if decode_rows > 0 {
                let old = self.decode_ms[slot];
                self.decode_ms[slot] = if old == 0.0 {
                    ms.max(f64::MIN_POSITIVE)
                } else {
                    (1.0 - EMA) * old + EMA * ms.max(f64::MIN_POSITIVE)
                };
            }
            return;
        }
        // The prompt tokens' share: the pass beyond its decode rows' known cost. Unknown with
        // decode rows not measured alone yet; then the pass teaches nothing about prompt tokens.
        let decode = if decode_rows == 0 {
            0.0
        } else {
            self.decode_ms[slot]
        };
        if decode_rows > 0 && decode == 0.0 {
            return;
        }
        self.last_prompt = prompt_tokens;
        // A pass faster than its decode rows alone (noise) says the tokens were free, not less.
        self.prompt_ms = (1.0 - EMA) * self.prompt_ms + EMA * (ms - decode).max(0.0);
        self.prompt_tokens = (1.0 - EMA) * self.prompt_tokens + EMA * prompt_tokens as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SequenceState::*;

    fn view(id: u64, state: SequenceState, priority: u8, prompt_left: usize) -> SeqView {
        SeqView {
            id,
            state,
            priority,
            prompt_left,
        }
    }

    #[test]
    fn every_decoding_sequence_moves_and_the_budget_goes_to_the_oldest_prompts_first() {
        let seqs = [
            view(1, Prefilling, 1, 30),
            view(2, Decoding, 1, 0),
            view(3, Prefilling, 1, 1000),
            view(4, Prefilling, 1, 5),
            view(5, Decoding, 1, 0),
        ];
        let decodes = [
            Work::Decode { id: 2, steps: 1 },
            Work::Decode { id: 5, steps: 1 },
        ];
        let prefill = |id, tokens| Work::Prefill { id, tokens };
        // What the oldest prompt leaves of the budget goes to the next.
        let cases = [
            (100, vec![prefill(1, 30), prefill(3, 70)]),
            (20, vec![prefill(1, 20)]),
            (2000, vec![prefill(1, 30), prefill(3, 1000), prefill(4, 5)]),
            // No budget: the streaming answers alone.
            (0, vec![]),
        ];
        for (budget, mut want) in cases {
            want.extend(decodes);
            assert_eq!(plan_round(&seqs, budget), want, "budget {budget}");
        }
    }

    #[test]
    fn a_short_prompt_goes_in_whole_and_a_long_one_is_paced() {
        let mut p = Pacer::new(256);
        // Nothing measured: the pacing's first steps, whatever the prompt.
        assert_eq!(p.budget_for(3, 37), (0, false));
        p.record(3, 0, 10.0);
        assert_eq!(p.budget_for(3, 37), (1, false));
        // Prompt tokens at 2 ms each: 37 take 74 ms, within the bound, so all go in; the
        // paced budget would be 3 (0.75 · 10 ms / 2 ms).
        p.record(3, 2, 14.0);
        assert_eq!(p.prefill_budget(3), 3);
        assert_eq!(p.budget_for(3, 37), (37, true));
        // 100 tokens (200 ms) are over it: paced. So is a prompt past the chunk.
        assert_eq!(p.budget_for(3, 100), (3, false));
        let mut small = Pacer::new(16);
        small.record(3, 0, 10.0);
        small.record(3, 2, 14.0);
        assert_eq!(small.budget_for(3, 37), (3, false));
        // Nothing streaming: the whole chunk, as before.
        assert_eq!(p.budget_for(0, 1000), (256, false));
    }

    #[test]
    fn the_last_chunk_is_what_is_left() {
        assert_eq!(
            plan_round(&[view(7, Prefilling, 1, 44)], 256),
            vec![Work::Prefill { id: 7, tokens: 44 }]
        );
    }

    #[test]
    fn paused_and_finished_sequences_get_nothing() {
        let seqs = [
            view(1, Paused, 1, 0),
            view(2, Finished, 1, 0),
            view(3, Paused, 1, 500),
            view(4, Queued, 1, 30),
        ];
        assert!(plan_round(&seqs, 256).is_empty());
    }

    #[test]
    fn priority_is_a_larger_share_of_decode_steps() {
        let seqs = [
            view(1, Decoding, 3, 0),
            view(2, Decoding, 1, 0),
            view(3, Decoding, 0, 0),
        ];
        assert_eq!(
            plan_round(&seqs, 256),
            vec![
                Work::Decode { id: 1, steps: 3 },
                Work::Decode { id: 2, steps: 1 },
                Work::Decode { id: 3, steps: 1 }
            ]
        );
    }

    #[test]
    fn the_pacer_gives_the_whole_chunk_when_nothing_streams_and_measures_before_it_shares() {
        let mut p = Pacer::new(256);
        assert_eq!(p.prefill_budget(0), 256);
        // Streaming answers whose decode pass was never timed: measure it first.
        assert_eq!(p.prefill_budget(3), 0);
        p.record(3, 0, 20.0);
        // Timed decode, prompt tokens not yet: one token, to time them.
        assert_eq!(p.prefill_budget(3), 1);
        // Three decode rows and ten prompt tokens in 30 ms: 1 ms a prompt token. A round may
        // take 1.75 × 20 ms, so 15 prompt tokens fit.
        p.record(3, 10, 30.0);
        assert_eq!(p.prefill_budget(3), 15);
        // Another batch size has its own decode cost, not yet measured.
        assert_eq!(p.prefill_budget(4), 0);
        // A pass of prompt tokens alone counts whole towards their cost.
        p.record(0, 100, 100.0);
        assert_eq!(p.prefill_budget(3), 15);
    }

    #[test]
    fn the_pacer_budget_is_at_least_one_token_and_at_most_the_chunk() {
        let mut p = Pacer::new(64);
        p.record(1, 0, 1.0);
        p.record(1, 1, 101.0); // a prompt token costs 100 decode passes
        assert_eq!(p.prefill_budget(1), 1);
        let mut p = Pacer::new(64);
        p.record(1, 0, 100.0);
        p.record(1, 1000, 101.0); // nearly free beside the weights' read
        assert_eq!(p.prefill_budget(1), 64);
        // Nonsense timings are ignored.
        p.record(1, 0, f64::NAN);
        p.record(1, 0, -5.0);
        assert_eq!(p.prefill_budget(1), 64);
    }

    /// A machine whose passes cost a fixed part (the weights' read), a part per decode row and
    /// a part per prompt token: after the first rounds, every round that carries prompt tokens
    /// stays within STALL times a decode-only round, and the prompt still gets through.
    #[test]
    fn paced_rounds_stay_within_the_stall_bound_while_prompts_get_through() {
        let cost = |decode: usize, prompt: usize| 12.0 + 1.5 * decode as f64 + 0.8 * prompt as f64;
        let mut p = Pacer::new(256);
        let mut seqs = vec![
            view(1, Decoding, 1, 0),
            view(2, Decoding, 1, 0),
            view(3, Prefilling, 1, 600),
            view(4, Prefilling, 1, 90),
        ];
        let decode_round = cost(2, 0);
        let mut rounds = 0;
        while seqs.iter().any(|s| s.state == Prefilling) {
            rounds += 1;
            assert!(rounds < 1000, "the prompts never got through");
            let plan = plan_round(&seqs, p.prefill_budget(2));
            let prompt: usize = plan
                .iter()
                .map(|w| match w {
                    Work::Prefill { tokens, .. } => *tokens,
                    Work::Decode { .. } => 0,
                })
                .sum();
            let ms = cost(2, prompt);
            if rounds > 2 {
                assert!(ms <= STALL * decode_round + 1e-9, "round {rounds}: {ms} ms");
            }
            p.record(2, prompt, ms);
            for w in plan {
                if let Work::Prefill { id, tokens } = w {
                    let s = seqs.iter_mut().find(|s| s.id == id).unwrap();
                    s.prompt_left -= tokens;
                    if s.prompt_left == 0 {
                        // It decodes from the next round on; the two that were decoding still
                        // count as the batch, as they would if these were previews.
                        s.state = Finished;
                    }
                }
            }
        }
        // The slack a round may use is 0.75 × 15 ms, 14 prompt tokens at 0.8 ms. Two rounds
        // measure (no prompt token, then one), two ramp up (4, 8), and the remaining 677 tokens
        // take 49 rounds. Fewer would break the bound, more would waste the slack.
        assert_eq!(rounds, 53);
    }

    /// Pass times that vary by ±60% around the same machine's: the budget follows the mean
    /// cost, so the prompt goes in at most of the noiseless rate, instead of collapsing to a
    /// token a round as when one noisy pass divided by its one prompt token sets the estimate.
    #[test]
    fn noisy_pass_times_do_not_starve_the_prompt() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut noise = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            0.4 + 1.2 * (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let cost = |prompt: usize| 15.0 + 0.8 * prompt as f64;
        let mut p = Pacer::new(256);
        let mut carried = Vec::new();
        for _ in 0..400 {
            let tokens = p.prefill_budget(2);
            p.record(2, tokens, cost(tokens) * noise());
            carried.push(tokens);
        }
        let mean = carried[100..].iter().sum::<usize>() as f64 / 300.0;
        // Noiseless, 14 tokens a round.
        assert!(
            (10.0..=20.0).contains(&mean),
            "{mean} prompt tokens a round"
        );
    }
}
