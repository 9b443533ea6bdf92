//! The flow's policy: which sequences do what in the next round.
//!
//! A pure function over views of the live sequences (DESIGN.md, style rule 8), so it is tested
//! without a model. Each round, every decoding sequence gets `priority` decode steps (1 by
//! default, so all answers move together), and at most one prefilling sequence gets one chunk of
//! its prompt, so a long prompt never freezes the answers that are streaming. Paused and
//! finished sequences get nothing, and so do queued ones (admission, which needs memory
//! accounting, is the engine's).

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

/// Plans one round. Sequences appear in admission order, so the oldest prefill goes first.
pub fn plan_round(seqs: &[SeqView], prefill_chunk: usize) -> Vec<Work> {
    let mut work = Vec::with_capacity(seqs.len());
    if let Some(p) = seqs
        .iter()
        .find(|s| s.state == SequenceState::Prefilling && s.prompt_left > 0)
    {
        work.push(Work::Prefill {
            id: p.id,
            tokens: p.prompt_left.min(prefill_chunk.max(1)),
        });
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
    fn every_decoding_sequence_moves_and_one_prefill_chunk_runs() {
        let seqs = [
            view(1, Decoding, 1, 0),
            view(2, Prefilling, 1, 1000),
            view(3, Prefilling, 1, 10),
            view(4, Decoding, 1, 0),
        ];
        assert_eq!(
            plan_round(&seqs, 256),
            vec![
                Work::Prefill { id: 2, tokens: 256 },
                Work::Decode { id: 1, steps: 1 },
                Work::Decode { id: 4, steps: 1 }
            ]
        );
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
}
