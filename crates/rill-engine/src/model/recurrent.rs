//! A sequence's recurrent state (Gated DeltaNet layers, `delta.rs`), kept in its KV cache
//! beside the attention layers' keys and values, and the copies of it that let the cache be
//! cut back.
//!
//! A recurrent layer has no rows to cut: its state holds the whole past at one position. So
//! the cache keeps copies of it taken at a few positions, and can be cut back only to one of
//! them (or to nothing); the tokens after it are run again (llama.cpp's context checkpoints):
//! - before every step of more than one token (a prompt's chunk, a speculative draft's check):
//!   a rejected draft goes back to the state before it and the accepted tokens are run again;
//! - where the prompt is in ([`Recurrent::checkpoint`]), and at the positions a sequence asks
//!   for inside its prompt ([`KvCache::keep_states_at`](super::KvCache::keep_states_at)):
//!   before its last token (an answer regenerated shares all of the prompt, but its last
//!   token runs again for the logits of the answer's first) and a few tokens before its end
//!   (a next turn, whose template renders the answer's header differently, parts from this
//!   prompt there), as llama.cpp's server keeps checkpoints a few tokens before a prompt's
//!   end;
//! - every [`PERIOD`] positions, the last [`PERIODIC`] of them: a turn that parts from the
//!   last one inside a long answer does not go back to its prompt.
//!
//! Each copy costs what the state does; [`Recurrent::bytes_for`] tells the memory budget
//! what a sequence's states may take at most.

use super::config::DecoderConfig;

/// Positions between periodic copies.
pub const PERIOD: usize = 512;
/// Periodic copies kept (the latest).
const PERIODIC: usize = 2;
/// Copies of the prompt's states kept: at its end and where the sequence asked.
const PROMPT_COPIES: usize = 3;
/// Copies a sequence may hold at once: the one before a step, the prompt's, the periodic ones
/// (and those being made during a step).
const MOST_SAVED: usize = 1 + 2 * PROMPT_COPIES + PERIODIC;

/// Why a copy was made, in the order of how long it is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    BeforeStep,
    Periodic,
    Prompt,
}

/// The recurrent layers' states at one position.
struct Saved {
    at: usize,
    kind: Kind,
    states: Vec<Vec<f32>>,
}

/// The recurrent layers' states of one sequence, and copies of them.
pub(super) struct Recurrent {
    /// Per layer, its state at the cache's length (empty for an attention layer).
    live: Vec<Vec<f32>>,
    saved: Vec<Saved>,
    /// Copies at positions inside this step, filled layer by layer as the step runs.
    making: Vec<Saved>,
}

impl Recurrent {
    /// Zeroed states for `cfg`'s recurrent layers; `None` for a model without any.
    pub(super) fn new(cfg: &DecoderConfig) -> Option<Recurrent> {
        let d = cfg.delta?;
        let live = cfg
            .recurrent
            .iter()
            .map(|&r| match r {
                true => vec![0.0; d.state_floats()],
                false => Vec::new(),
            })
            .collect();
        Some(Recurrent {
            live,
            saved: Vec::new(),
            making: Vec::new(),
        })
    }

    /// Whether it was made for `cfg`.
    pub(super) fn fits(&self, cfg: &DecoderConfig) -> bool {
        let floats = cfg.delta.map_or(0, |d| d.state_floats());
        self.live.len() == cfg.recurrent.len()
            && self
                .live
                .iter()
                .zip(&cfg.recurrent)
                .all(|(s, &r)| s.len() == if r { floats } else { 0 })
    }

    /// Bytes of the states at most a sequence holds: its own and [`MOST_SAVED`] copies.
    pub(super) fn bytes_for(cfg: &DecoderConfig) -> usize {
        let layers = cfg.recurrent.iter().filter(|r| **r).count();
        let floats = cfg.delta.map_or(0, |d| d.state_floats());
        (1 + MOST_SAVED) * layers * floats * std::mem::size_of::<f32>()
    }

    /// Bytes held: the states and their copies.
    pub(super) fn bytes(&self) -> usize {
        let floats = |s: &[Vec<f32>]| s.iter().map(Vec::len).sum::<usize>();
        let saved: usize = self
            .saved
            .iter()
            .chain(&self.making)
            .map(|s| floats(&s.states))
            .sum();
        (floats(&self.live) + saved) * std::mem::size_of::<f32>()
    }

    /// Whether `layer` has a state (is recurrent).
    pub(super) fn is_recurrent(&self, layer: usize) -> bool {
        self.live.get(layer).is_some_and(|s| !s.is_empty())
    }

    pub(super) fn state_mut(&mut self, layer: usize) -> Option<&mut [f32]> {
        self.live
            .get_mut(layer)
            .filter(|s| !s.is_empty())
            .map(Vec::as_mut_slice)
    }

    /// The longest prefix of at most `want` positions that a cache of `len` positions can be
    /// cut back to: all of it, or a copy's position, or nothing.
    pub(super) fn reachable(&self, want: usize, len: usize) -> usize {
        let want = want.min(len);
        if want == len {
            return len;
        }
        self.saved
            .iter()
            .map(|s| s.at)
            .filter(|&at| at <= want)
            .max()
            .unwrap_or(0)
    }

    /// Copies the states at `at` (every copy at or before the cache's length holds the states
    /// of the tokens it holds now: going back drops the later ones), keeping at most one copy
    /// of a kind but the periodic ones, the oldest going first.
    fn save(&mut self, at: usize, kind: Kind) {
        let states = self.live.clone();
        self.keep(Saved { at, kind, states });
    }

    /// Keeps `copy` (see [`save`](Self::save)).
    fn keep(&mut self, mut copy: Saved) {
        let Saved { at, kind, .. } = copy;
        if at == 0 {
            return;
        }
        if let Some(i) = self.saved.iter().position(|s| s.at == at) {
            // The same states, kept as the longer-lived kind (the prompt's, then a periodic
            // one, then the one before a step), under that kind's bound.
            let held = self.saved.swap_remove(i);
            let kind = held.kind.max(kind);
            copy = Saved { kind, ..held };
        }
        let kind = copy.kind;
        let limit = match kind {
            Kind::Periodic => PERIODIC,
            Kind::Prompt => PROMPT_COPIES,
            Kind::BeforeStep => 1,
        };
        while self.saved.iter().filter(|s| s.kind == kind).count() >= limit {
            let oldest = (0..self.saved.len())
                .filter(|&i| self.saved[i].kind == kind)
                .min_by_key(|&i| self.saved[i].at);
            match oldest {
                Some(i) => drop(self.saved.swap_remove(i)),
                None => break,
            }
        }
        self.saved.push(copy);
    }

    /// Before a step of `extra` tokens after `len`: a copy of the states when the step runs
    /// more than one token (it can then be cut back into), or when a period has passed; and
    /// copies to make during the step at the `wanted` positions it passes.
    pub(super) fn before_step(&mut self, len: usize, extra: usize, wanted: &[usize]) {
        self.making.clear();
        if extra > 1 {
            self.save(len, Kind::BeforeStep);
        }
        for &at in wanted {
            if at == len {
                self.save(at, Kind::Prompt);
            } else if at > len && at < len + extra {
                self.making.push(Saved {
                    at,
                    kind: Kind::Prompt,
                    states: vec![Vec::new(); self.live.len()],
                });
            }
        }
        let last = self
            .saved
            .iter()
            .filter(|s| s.kind == Kind::Periodic)
            .map(|s| s.at)
            .max()
            .unwrap_or(0);
        if len >= last + PERIOD {
            self.save(len, Kind::Periodic);
        }
    }

    /// Before `layer` runs the token at position `at`: its state joins the copy being made
    /// there, if one is (the layers' parts together are kept once the step is done).
    pub(super) fn keep_before(&mut self, layer: usize, at: usize) {
        let live = &self.live;
        for m in self.making.iter_mut().filter(|m| m.at == at) {
            if let Some(state) = live.get(layer) {
                m.states[layer].clone_from(state);
            }
        }
    }

    /// After a step: the copies made during it, those whose every layer made its part.
    pub(super) fn after_step(&mut self) {
        for m in std::mem::take(&mut self.making) {
            if m.states
                .iter()
                .zip(&self.live)
                .all(|(s, l)| s.len() == l.len())
            {
                self.keep(m);
            }
        }
    }

    /// A copy of the states at `len`, the prompt's end.
    pub(super) fn checkpoint(&mut self, len: usize) {
        self.save(len, Kind::Prompt);
    }

    /// Goes back to the copy at `to` (which [`reachable`](Self::reachable) gave) and forgets
    /// the copies after it; `to == 0` zeroes the states.
    pub(super) fn go_back(&mut self, to: usize) {
        self.saved.retain(|s| s.at <= to);
        match self.saved.iter().find(|s| s.at == to) {
            Some(s) if to > 0 => {
                for (live, kept) in self.live.iter_mut().zip(&s.states) {
                    live.copy_from_slice(kept);
                }
            }
            _ => self.clear(),
        }
    }

    /// Zeroed states, no copies.
    pub(super) fn clear(&mut self) {
        self.saved.clear();
        self.making.clear();
        self.live.iter_mut().for_each(|s| s.fill(0.0));
    }

    /// The states at `to` (the live ones when `to == len`, else a copy's), with no copies.
    pub(super) fn at(&self, to: usize, len: usize) -> Recurrent {
        let states = match to == len {
            true => Some(&self.live),
            false => self.saved.iter().find(|s| s.at == to).map(|s| &s.states),
        };
        let live = match states {
            Some(s) if to > 0 => s.clone(),
            _ => self.live.iter().map(|s| vec![0.0; s.len()]).collect(),
        };
        Recurrent {
            live,
            saved: Vec::new(),
            making: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(layers: usize) -> Recurrent {
        Recurrent {
            live: vec![vec![0.0; 3]; layers],
            saved: Vec::new(),
            making: Vec::new(),
        }
    }

    #[test]
    fn a_cache_goes_back_only_to_a_copy() {
        let mut r = states(2);
        r.live[0][0] = 1.0;
        r.checkpoint(10);
        r.live[0][0] = 2.0;
        r.before_step(14, 4, &[17, 12]);
        r.live[0][0] = 2.5;
        r.keep_before(0, 17);
        r.keep_before(1, 17);
        r.live[0][0] = 3.0;
        r.after_step();
        // Live at 18: copies at 10 and 14.
        assert_eq!(r.reachable(18, 18), 18);
        assert_eq!(r.reachable(17, 18), 17);
        assert_eq!(r.reachable(16, 18), 14);
        assert_eq!(r.reachable(13, 18), 10);
        assert_eq!(r.reachable(9, 18), 0);
        r.go_back(17);
        assert_eq!(r.live[0][0], 2.5);
        r.go_back(14);
        assert_eq!(r.live[0][0], 2.0);
        r.go_back(10);
        assert_eq!(r.live[0][0], 1.0);
        assert_eq!(r.reachable(12, 10), 10);
        r.go_back(0);
        assert_eq!(r.live[0][0], 0.0);
        assert_eq!(r.bytes(), 2 * 3 * 4);
    }

    #[test]
    fn copies_are_bounded() {
        let mut r = states(1);
        for step in 1..40 {
            r.before_step(step * PERIOD / 3, 2, &[]);
        }
        r.checkpoint(5);
        assert!(r.saved.len() <= MOST_SAVED, "{}", r.saved.len());
        assert!(
            r.saved
                .iter()
                .filter(|s| s.kind == Kind::BeforeStep)
                .count()
                <= 1
        );
        assert_eq!(
            r.saved.iter().filter(|s| s.kind == Kind::Periodic).count(),
            PERIODIC
        );
    }
}
