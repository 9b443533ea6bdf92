//! Draft-model speculation (issue 17): a second, smaller model of the same vocabulary proposes
//! an answer's next tokens, and the model checks them in one pass (`sequence/speculation.rs`).
//!
//! The draft runs inside the inference thread, before each decode step, as batched passes of
//! its own: the first catches every speculating answer's draft cache up with its tokens (at
//! most a prefill chunk at a time, so a long prompt is caught up over several steps and a
//! step stays bounded; after a pause only the answer's latest tokens), the next ones each add
//! one greedy token to every proposal, so [`propose`] deals a pass's draft tokens evenly among
//! the answers (a step costs as many draft passes as its longest proposal). What the model
//! rejects is cut from the draft's cache as from the model's.
//!
//! A draft must spell every token as the model does: [`check_vocabulary`] compares the two
//! vocabularies at load (as llama.cpp does, allowing the larger to have up to 128 more ids
//! at its end, which no proposal uses).

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Result};
use crate::model::{Decoder, Model};
use crate::sequence::Sequence;
use crate::tokenizer::Tokenizer;

/// How many more ids one vocabulary may have than the other (padding, extra control tokens).
const MAX_EXTRA_IDS: usize = 128;

/// A loaded draft model.
pub(crate) struct DraftModel {
    weights: Decoder,
    /// Ids both vocabularies spell alike: proposals and inputs stay below it.
    shared_vocab: usize,
    pub(crate) path: PathBuf,
    pub(crate) name: String,
}

/// What the engine tells about its draft model.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DraftInfo {
    pub path: PathBuf,
    pub name: String,
    pub quantization: String,
}

impl DraftModel {
    /// Whether its weights have panels still to be made (`kernels/later.rs`).
    /// Locks its weights in memory (`model/resident.rs`).
    pub(crate) fn lock_weights(&mut self) -> Result<usize, crate::model::LockRefused> {
        self.weights.lock_weights()
    }

    pub(crate) fn panels_pending(&self) -> bool {
        self.weights.panels_pending()
    }

    /// Makes the next matrix's panels; `false` once none is left.
    pub(crate) fn make_next_panels(&mut self) -> bool {
        self.weights.make_next_panels()
    }
    /// Loads `path` as a draft for a model with the vocabulary `main`; refuses a file whose
    /// vocabulary differs. `context_cap` as for the model.
    pub(crate) fn load(
        path: &Path,
        device: &Device,
        main: &Tokenizer,
        context_cap: usize,
    ) -> Result<(DraftModel, DraftInfo)> {
        let Model {
            info,
            weights,
            tokenizer,
            ..
        } = Model::load(path, device, Some(context_cap))?;
        let shared_vocab = check_vocabulary(main, &tokenizer).map_err(|message| {
            Error::model_file(
                path,
                format!(
                    "cannot draft for this model: {message}; a draft must be of the same family"
                ),
            )
        })?;
        let about = DraftInfo {
            path: path.to_path_buf(),
            name: info.name.clone(),
            quantization: info.quantization.clone(),
        };
        Ok((
            DraftModel {
                weights,
                shared_vocab,
                path: path.to_path_buf(),
                name: info.name,
            },
            about,
        ))
    }

    /// Fills each answer's proposal for this step (the answers that want one, with the
    /// number of tokens each wants). A failed pass leaves those answers without a proposal
    /// and with a fresh draft cache; the step goes on without them.
    pub(crate) fn propose(&self, seqs: &mut [(&mut Sequence, usize)], chunk: usize) {
        let ctx = self.weights.config().context_length;
        // Each answer's proposal stops at the draft's context.
        for (s, k) in seqs.iter_mut() {
            let room = ctx.saturating_sub(s.tokens().len() + 1);
            *k = (*k).min(room);
            // A token the draft cannot read (one of the model's extra ids) is never fed to it,
            // so only the tokens its cache lacks need a look.
            if s.draft_lag()
                .iter()
                .any(|&t| t as usize >= self.shared_vocab)
            {
                *k = 0;
            }
        }
        let mut active: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].1 > 0).collect();
        let mut first = true;
        while !active.is_empty() {
            let mut ready = Vec::with_capacity(active.len());
            let mut inputs: Vec<_> = Vec::with_capacity(active.len());
            // `seqs[i]` for i in `active`, in order, each borrowed once.
            let mut picked: Vec<&mut Sequence> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| active.contains(i))
                .map(|(_, (s, _))| &mut **s)
                .collect();
            for s in picked.iter_mut() {
                if first {
                    let (t, c, caught_up) = s.draft_catch_up(chunk);
                    ready.push(caught_up);
                    inputs.push((t, c));
                } else {
                    let (t, c) = s.draft_continue();
                    ready.push(true);
                    inputs.push((t, c));
                }
            }
            let outs = vec![1; inputs.len()];
            let started = std::time::Instant::now();
            let rows: usize = inputs.iter().map(|(t, _)| t.len()).sum();
            let result = self.weights.forward_rows(&mut inputs, &outs);
            tracing::trace!(
                rows,
                ms = started.elapsed().as_secs_f64() * 1000.0,
                "draft pass"
            );
            drop(inputs);
            let logits = match result {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "draft pass failed; no proposal this step");
                    for s in picked.iter_mut() {
                        s.reset_draft();
                    }
                    return;
                }
            };
            let mut next = Vec::with_capacity(active.len());
            for ((&i, s), (row, ready)) in active
                .iter()
                .zip(picked.iter_mut())
                .zip(logits.iter().zip(ready))
            {
                // Still catching up: no proposal this step.
                if !ready {
                    continue;
                }
                if let Some(id) = argmax(row).filter(|&id| (id as usize) < self.shared_vocab) {
                    s.push_draft(id);
                    next.push(i);
                }
            }
            drop(picked);
            // On while an answer wants more.
            next.retain(|&i| seqs[i].0.draft_len() < seqs[i].1);
            active = next;
            first = false;
        }
    }
}

/// The likeliest id of a row of logits.
fn argmax(row: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// The ids two vocabularies spell alike, or why they are not one vocabulary: the same
/// beginning and end tokens, sizes within [`MAX_EXTRA_IDS`] of each other, and every id
/// below the smaller size the same token.
pub(crate) fn check_vocabulary(
    main: &Tokenizer,
    draft: &Tokenizer,
) -> std::result::Result<usize, String> {
    let (a, b) = (main.vocab_size(), draft.vocab_size());
    if a.abs_diff(b) > MAX_EXTRA_IDS {
        return Err(format!("its vocabulary has {b} tokens, the model's {a}"));
    }
    if main.bos_id() != draft.bos_id() || main.eos_id() != draft.eos_id() {
        return Err(format!(
            "its beginning and end tokens ({:?}, {:?}) are not the model's ({:?}, {:?})",
            draft.bos_id(),
            draft.eos_id(),
            main.bos_id(),
            main.eos_id()
        ));
    }
    let n = a.min(b);
    for id in 0..n as u32 {
        let (x, y) = (main.token_text(id), draft.token_text(id));
        if x != y {
            return Err(format!(
                "token {id} is {:?} in it but {:?} in the model",
                y.unwrap_or_default(),
                x.unwrap_or_default()
            ));
        }
    }
    Ok(n)
}

/// This pass's drafts, for the answers whose step draws a token (a decode step, or the chunk
/// that ends a prompt), at most `limit` tokens in all, handed first to the answers whose drafts
/// were taken most: lookup's, then the draft model's passes for those drafting with it.
pub(crate) fn propose(
    draft: &Option<Box<DraftModel>>,
    pool: &rayon::ThreadPool,
    chunk: usize,
    limit: usize,
    members: &mut [(&mut Sequence, usize)],
) {
    let mut order: Vec<(f64, &mut Sequence)> = members
        .iter_mut()
        .filter(|(s, n)| !s.is_preview() && *n == s.pending())
        .map(|(s, _)| (s.speculates().unwrap_or(0.0), &mut **s))
        .collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut left = limit;
    let mut wanting: Vec<(&mut Sequence, usize)> = Vec::new();
    for (_, s) in order {
        s.prepare_draft(left);
        left -= s.draft_len();
        let k = s.model_draft_wanted(left);
        if k > 0 {
            wanting.push((s, k));
        }
    }
    let dealt = deal(left, &wanting.iter().map(|w| w.1).collect::<Vec<_>>());
    let mut drafting: Vec<(&mut Sequence, usize)> = wanting
        .into_iter()
        .zip(dealt)
        .filter(|(_, k)| *k > 0)
        .map(|((s, _), k)| (s, k))
        .collect();
    if let (Some(d), false) = (draft, drafting.is_empty()) {
        pool.install(|| d.propose(&mut drafting, chunk));
    }
}

/// A draft model proposes one token for every drafting answer per pass, so a step costs as
/// many passes as the longest proposal: `total` tokens are dealt one at a time to the answers
/// `wants` lists (in order, each at most what it wants), so that the passes are as few as the
/// cap allows: eight tokens for four answers are eight passes given to one, two given evenly.
fn deal(total: usize, wants: &[usize]) -> Vec<usize> {
    let mut given = vec![0; wants.len()];
    let mut left = total;
    while left > 0 {
        let before = left;
        for (g, &w) in given.iter_mut().zip(wants) {
            if left > 0 && *g < w {
                *g += 1;
                left -= 1;
            }
        }
        if left == before {
            break;
        }
    }
    given
}

#[cfg(test)]
mod tests {
    use super::{argmax, deal};

    #[test]
    fn argmax_takes_the_first_of_equal_largest() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), Some(1));
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn a_draft_models_tokens_are_dealt_evenly_in_order() {
        // Four answers wanting eight each share a cap of eight: two each, two passes.
        assert_eq!(deal(8, &[8, 8, 8, 8]), [2, 2, 2, 2]);
        // The first in order get the remainder; none gets more than it wants.
        assert_eq!(deal(7, &[8, 1, 8, 8]), [2, 1, 2, 2]);
        assert_eq!(deal(100, &[3, 1]), [3, 1]);
        assert_eq!(deal(0, &[4]), [0]);
        assert!(deal(5, &[]).is_empty());
    }
}
