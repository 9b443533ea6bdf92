//! The inference thread: one loop that owns the weights and every live sequence.
//!
//! Each turn of [`run`] applies the commands that arrived, admits what fits the KV budget,
//! plans a round (scheduler.rs) and runs it as batched forward passes, then retires what
//! finished, keeping complete answers' caches for prefix reuse. The round's prompt budget comes
//! from the [`Pacer`], which times every pass, so a new prompt slows the streaming answers by a
//! bounded factor instead of pausing them, and a short one runs first, whole.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use tokio::sync::oneshot;

use crate::command::{Command, PreviewJob, Shared};
use crate::draft::{propose, DraftModel};
use crate::error::{Error, Result};
use crate::model::decoder::Injected;
use crate::model::decoder::KV_MIN_CAPACITY;
use crate::prefix_cache::PrefixCache;
use crate::sampler::Distribution;
use crate::scheduler::{plan_round, Pacer, SequenceState, Work};
use crate::sequence::Sequence;
use crate::stop::StopReason;
use crate::vision::PromptImage;
use crate::weigh::{Verdict, Weigher};

/// The inference thread's state: the weights, the live sequences in admission order, the
/// kept prefixes, and the memory they may use.
pub(crate) struct Worker {
    model: crate::model::Decoder,
    shared: Arc<Shared>,
    seqs: Vec<Sequence>,
    prefixes: PrefixCache,
    budget: usize,
    /// What passes cost, and so how many prompt tokens a round may carry.
    pacer: Pacer,
    /// The threads forward passes run on.
    pool: rayon::ThreadPool,
    /// The last preview's prompt and logits: a slider moving asks again for the same prompt.
    preview: Option<(Vec<u32>, Vec<f32>)>,
    /// Previews waiting for their prompt's logits, by sequence id.
    previews: Vec<(u64, oneshot::Sender<Result<Distribution>>)>,
    /// Proposes tokens for answers that speculate with a draft model (`draft.rs`).
    draft: Option<Box<DraftModel>>,
    /// The most prompt tokens one pass takes (a draft's catch-up too).
    prefill_chunk: usize,
    /// What drafts cost the passes that check them, and so how many a pass may check.
    weigher: Weigher,
}

/// The inference thread, kept alive: [`run`], and should it panic (a bug, or a file that
/// reached one), every answer in flight ends with an error, the kept prefixes and draft caches
/// are dropped, and the loop starts again on the same weights, so the engine goes on serving
/// everyone else instead of leaving every handle with a dead thread (issue 40). A thread that
/// panics again and again (three times within a minute) stops for good.
pub(crate) fn run_guarded(mut worker: Worker, rx: mpsc::Receiver<Command>) {
    let mut recent: Vec<Instant> = Vec::new();
    loop {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut worker, &rx)));
        let Err(panic) = outcome else {
            return;
        };
        let what = crate::error::panic_message(panic.as_ref());
        tracing::error!(panic = %what, "the inference thread panicked; restarting it");
        worker.recover(&what);
        recent.retain(|t| t.elapsed().as_secs() < 60);
        recent.push(Instant::now());
        if recent.len() >= 3 {
            tracing::error!("the inference thread panicked three times in a minute; stopping");
            return;
        }
    }
}

/// The inference thread: apply commands, admit what fits, plan a round, run it, retire.
fn run(worker: &mut Worker, rx: &mpsc::Receiver<Command>) {
    loop {
        // Block only when there is nothing to compute.
        let busy = worker.seqs.iter().any(|s| {
            matches!(
                s.state(),
                SequenceState::Prefilling | SequenceState::Decoding | SequenceState::Queued
            )
        });
        if !busy {
            // Idle: the weights' panels still to be made, one matrix between commands.
            let cmd = match worker.panels_pending() {
                true => match rx.try_recv() {
                    Err(mpsc::TryRecvError::Empty) => {
                        worker.make_next_panels();
                        continue;
                    }
                    got => got.map_err(|_| ()),
                },
                false => rx.recv().map_err(|_| ()),
            };
            match cmd {
                Ok(cmd) => {
                    if !worker.apply(cmd) {
                        return;
                    }
                }
                Err(()) => return, // every handle is gone
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if !worker.apply(cmd) {
                        return;
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    if worker.seqs.is_empty() {
                        return;
                    }
                    break;
                }
            }
        }
        for s in worker
            .seqs
            .iter_mut()
            .filter(|s| s.state() != SequenceState::Finished && s.receiver_gone())
        {
            s.finish(StopReason::Cancelled);
        }
        worker.retire();
        worker.admit();
        worker.round();
        worker.retire();
    }
}

impl Worker {
    /// After a panic: every live answer ends with an error naming it (what it had streamed
    /// stays its own: the store keeps a partial answer), previews are told, and the caches that
    /// the interrupted pass may have left half-written go.
    fn recover(&mut self, what: &str) {
        let message = format!("the engine hit an internal error and restarted: {what}");
        for mut s in self.seqs.drain(..) {
            if s.finish_reason().is_none() {
                s.fail(message.clone());
            }
        }
        for (_, reply) in self.previews.drain(..) {
            let _ = reply.send(Err(Error::Candle(candle_core::Error::Msg(message.clone()))));
        }
        self.prefixes = PrefixCache::default();
        self.preview = None;
        self.shared.cache_bytes.store(0, Ordering::Relaxed);
        self.shared.prefix_bytes.store(0, Ordering::Relaxed);
        if let Ok(mut live) = self.shared.live.lock() {
            live.clear();
        }
    }

    /// Whether the model's (or the draft's) weights have panels still to be made (told to
    /// the handles too: a prompt may have made the last ones).
    fn panels_pending(&self) -> bool {
        let pending =
            self.model.panels_pending() || self.draft.as_ref().is_some_and(|d| d.panels_pending());
        self.shared.panels_pending.store(pending, Ordering::Relaxed);
        pending
    }

    /// Makes the next matrix's panels, on the compute threads (`kernels/later.rs`).
    fn make_next_panels(&mut self) {
        let (model, draft) = (&mut self.model, &mut self.draft);
        self.pool.install(|| {
            if !model.make_next_panels() {
                if let Some(d) = draft.as_mut() {
                    d.make_next_panels();
                }
            }
        });
    }

    /// `prefill_chunk`: the most prompt tokens one pass takes; `budget`: KV-cache bytes.
    pub(crate) fn new(
        model: crate::model::Decoder,
        shared: Arc<Shared>,
        budget: usize,
        prefill_chunk: usize,
        pool: rayon::ThreadPool,
        weigh_speculation: bool,
    ) -> Self {
        Worker {
            model,
            shared,
            seqs: Vec::new(),
            prefixes: PrefixCache::default(),
            budget,
            pacer: Pacer::new(prefill_chunk),
            pool,
            preview: None,
            previews: Vec::new(),
            draft: None,
            prefill_chunk,
            weigher: Weigher::new(weigh_speculation),
        }
    }

    /// A new draft model (or none). Draft caches made by the one before are dropped.
    pub(crate) fn set_draft(&mut self, draft: Option<DraftModel>) {
        self.replace_draft(draft.map(Box::new));
    }

    fn replace_draft(&mut self, draft: Option<Box<DraftModel>>) {
        for s in self.seqs.iter_mut() {
            s.reset_draft();
        }
        if let Some(d) = &draft {
            tracing::info!(name = %d.name, path = %d.path.display(), "draft model loaded");
        }
        self.draft = draft;
    }

    fn used(&self) -> usize {
        self.seqs.iter().map(Sequence::cache_bytes).sum::<usize>() + self.prefixes.bytes()
    }

    /// Frees memory for `need` more bytes: kept prefixes first (least recently used), then the
    /// caches of paused answers (lowest priority first; they are recomputed on resume).
    fn make_room(&mut self, need: usize) -> bool {
        while self.used() + need > self.budget {
            if self.prefixes.evict_lru() {
                continue;
            }
            let victim = self
                .seqs
                .iter_mut()
                .filter(|s| s.state() == SequenceState::Paused && s.cache_bytes() > 0)
                .min_by_key(|s| s.priority);
            match victim {
                Some(s) => s.evict(),
                None => return false,
            }
        }
        true
    }

    /// Over budget with only running answers left: the lowest-priority, most recently admitted
    /// one gives its cache up and waits in the queue, to be recomputed when memory frees. The
    /// last running answer is never preempted, so the engine always makes progress.
    fn preempt(&mut self) {
        while self.used() > self.budget {
            let running: Vec<usize> = (0..self.seqs.len())
                .filter(|&i| {
                    matches!(
                        self.seqs[i].state(),
                        SequenceState::Prefilling | SequenceState::Decoding
                    ) && self.seqs[i].cache_bytes() > 0
                })
                .collect();
            if running.len() <= 1 {
                return;
            }
            let Some(&victim) = running
                .iter()
                .min_by_key(|&&i| (self.seqs[i].priority, std::cmp::Reverse(i)))
            else {
                return;
            };
            tracing::info!(
                seq = self.seqs[victim].id,
                "KV budget full: preempting, to be recomputed"
            );
            self.seqs[victim].evict();
        }
    }

    /// Admits queued sequences in order while their prompts fit the budget; tells the others
    /// their place. A sequence alone is always admitted, so a small budget slows, never blocks.
    fn admit(&mut self) {
        let mut position = 0;
        for i in 0..self.seqs.len() {
            if self.seqs[i].state() != SequenceState::Queued {
                continue;
            }
            if position == 0 {
                let reused = if self.seqs[i].is_preview() {
                    self.prefixes.copy_longest(self.seqs[i].tokens())
                } else {
                    self.prefixes.take_longest(self.seqs[i].tokens())
                };
                let have = reused.as_ref().map_or(0, |c| c.len());
                // A fresh cache starts at KV_MIN_CAPACITY positions: count what it will take.
                let total = self.seqs[i].tokens().len();
                let need = match have {
                    0 => self
                        .model
                        .kv_bytes(total.max(KV_MIN_CAPACITY).min(self.shared.context_length)),
                    _ => self.model.kv_bytes(total) - self.model.kv_bytes(have),
                };
                let alone = !self.seqs.iter().any(|s| s.admitted && s.cache_bytes() > 0);
                if self.make_room(need) || alone {
                    self.seqs[i].admit(reused);
                    continue;
                }
                if let Some(c) = reused.filter(|_| !self.seqs[i].is_preview()) {
                    let tokens = self.seqs[i].tokens()[..c.len()].to_vec();
                    self.prefixes.insert(tokens, c);
                }
            }
            self.seqs[i].queued_at(position);
            position += 1;
        }
    }

    /// Runs one round: the plan's work as batched forward passes. A sequence with priority p
    /// takes part in the first p passes, everyone else in the first; a short prompt that goes
    /// in whole (`Pacer::budget_for`) runs in a pass of its own before them.
    fn round(&mut self) {
        let views: Vec<_> = self.seqs.iter().map(Sequence::view).collect();
        // The decode rows this round's passes will carry: one per decoding answer, and as many
        // check rows as each drafted last time (the pacer prices prompt tokens against them).
        let decode_rows: usize = self
            .seqs
            .iter()
            .filter(|s| s.state() == SequenceState::Decoding)
            .map(Sequence::expected_rows)
            .sum();
        // The oldest waiting prompt's tokens left: a short one goes in whole, in a pass of its
        // own ahead of the streaming answers' (its first token as soon as alone).
        let next = views
            .iter()
            .find(|v| v.state == SequenceState::Prefilling && v.prompt_left > 0)
            .map_or(0, |v| v.prompt_left);
        let (budget, whole) = self.pacer.budget_for(decode_rows, next);
        let ahead = usize::from(whole);
        let plan = plan_round(&views, budget);
        let passes = plan
            .iter()
            .map(|w| {
                if let Work::Decode { steps, .. } = w {
                    *steps
                } else {
                    1
                }
            })
            .max()
            .unwrap_or(0);
        let mut rows_of: Vec<(u64, usize)> = Vec::new();
        for pass in 0..passes + ahead {
            // (sequence id, tokens to run) for this pass; with a prompt ahead, the first pass
            // is its own and the decode steps follow.
            let decode_pass = pass.checked_sub(ahead);
            let mut want: Vec<(u64, usize)> = Vec::new();
            for w in &plan {
                match *w {
                    Work::Prefill { id, tokens } if pass == 0 => want.push((id, tokens)),
                    Work::Decode { id, steps } if decode_pass.is_some_and(|p| p < steps) => {
                        want.push((id, 1))
                    }
                    _ => {}
                }
            }
            let mut members: Vec<(&mut Sequence, usize)> = self
                .seqs
                .iter_mut()
                .filter_map(|s| {
                    let n = want.iter().find(|(id, _)| *id == s.id)?.1;
                    // A decode pass only for sequences still decoding (one may have finished).
                    let ok = match s.state() {
                        SequenceState::Decoding => n == 1,
                        SequenceState::Prefilling => pass == 0,
                        _ => false,
                    };
                    // A prompt's chunk takes an image whole or not at all.
                    let n = match s.state() {
                        SequenceState::Prefilling => s.whole_images(n),
                        _ => n,
                    };
                    ok.then_some((s, n))
                })
                .collect();
            if members.is_empty() {
                break;
            }
            for (s, n) in &members {
                match rows_of.iter_mut().find(|r| r.0 == s.id) {
                    Some(r) => r.1 += n,
                    None => rows_of.push((s.id, *n)),
                }
            }
            // An answer that speculates checks its draft in a step that draws: its last token
            // (or its prompt's last chunk) and the draft go in, and the logits of the draft's
            // rows and the row before come back. A pass of decoding answers only is weighed
            // (`weigh.rs`), with the draft passes that made its proposals.
            let started = Instant::now();
            let measured = members
                .iter()
                .all(|(s, _)| s.state() == SequenceState::Decoding);
            let speculating = members.iter().any(|(s, _)| s.speculates().is_some());
            let limit = if speculating {
                self.weigher.allow(members.len(), measured)
            } else {
                0
            };
            propose(
                &self.draft,
                &self.pool,
                self.prefill_chunk,
                limit,
                &mut members,
            );
            let before: usize = members.iter().map(|(s, _)| s.tokens().len()).sum();
            let outs: Vec<usize> = members.iter().map(|(s, _)| s.logit_rows()).collect();
            // Decode rows are the decoding sequences' rows, a draft's check included (the
            // pacer weighs them as the decode step they are); everything else is prompt.
            let decode_rows: usize = members
                .iter()
                .zip(&outs)
                .filter(|((s, _), _)| s.state() == SequenceState::Decoding)
                .map(|(_, &o)| o)
                .sum();
            // Image rows are given as the text model's rows; a draft's check has none.
            let images: Vec<Vec<PromptImage>> = members
                .iter()
                .map(|(s, n)| match s.state() {
                    SequenceState::Prefilling => s.step_images(*n),
                    _ => Vec::new(),
                })
                .collect();
            let injected: Vec<Injected> = images
                .iter()
                .enumerate()
                .flat_map(|(i, ims)| {
                    ims.iter().map(move |im| Injected {
                        seq: i,
                        at: im.at,
                        rows: &im.rows.values,
                        both_ways: im.both_ways,
                        grid: (im.rows.nx, im.rows.ny),
                    })
                })
                .collect();
            let mut inputs: Vec<(&[u32], &mut crate::model::KvCache)> =
                members.iter_mut().map(|(s, n)| s.step_input(*n)).collect();
            let rows: usize = inputs.iter().map(|(t, _)| t.len()).sum();
            let forward_started = Instant::now();
            // Inside the engine's own pool: the parallel matmuls (and candle's ops) split work
            // among threads that are already awake in this pass, instead of waking a pool from
            // outside and sleeping until it is done, once per matmul (211 times a token).
            let model = &self.model;
            let result = self
                .pool
                .install(|| model.forward_rows_with(&mut inputs, &outs, &injected));
            drop(inputs);
            let ms = forward_started.elapsed().as_secs_f64() * 1000.0;
            self.pacer.record(decode_rows, rows - decode_rows, ms);
            tracing::trace!(decode_rows, prompt_tokens = rows - decode_rows, ms, "pass");
            match result {
                Ok(logits) => {
                    for ((s, _), l) in members.iter_mut().zip(logits) {
                        if let Err(e) = s.after_step(&self.shared.tokenizer, l) {
                            tracing::error!(seq = s.id, error = %e, "sampling failed");
                            s.fail(e.to_string());
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "forward pass failed");
                    for (s, _) in members.iter_mut() {
                        s.fail(e.to_string());
                    }
                }
            }
            if speculating && measured {
                let drawn = members.iter().map(|(s, _)| s.tokens().len()).sum::<usize>() - before;
                let drafted = outs.iter().any(|&o| o > 1);
                // An answer that does not speculate only bears the others' check rows.
                let bystander = members.iter().any(|(s, _)| s.speculates().is_none());
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                let verdict = self
                    .weigher
                    .observe(members.len(), drafted, bystander, drawn, ms);
                // Where drafts cost the machine, the answers that drafted pause theirs.
                if let Some(v) = verdict.filter(|v| *v != Verdict::Crowding) {
                    for ((s, _), _) in members.iter_mut().zip(&outs).filter(|(_, &o)| o > 1) {
                        s.weighed(&v);
                    }
                }
            }
        }
        // Shares of the machine: each sequence's rows of this round, smoothed over rounds.
        let total: usize = rows_of.iter().map(|r| r.1).sum();
        if total > 0 {
            for s in self.seqs.iter_mut() {
                let rows = rows_of.iter().find(|r| r.0 == s.id).map_or(0, |r| r.1);
                s.share = 0.7 * s.share + 0.3 * rows as f32 / total as f32;
            }
        }
    }

    /// Finished sequences leave; the caches of complete answers are kept for prefix reuse.
    fn retire(&mut self) {
        let mut i = 0;
        while i < self.seqs.len() {
            let s = &mut self.seqs[i];
            match s.finish_reason() {
                None => i += 1,
                Some(reason) => {
                    if s.is_preview() {
                        let logits = s.take_preview_logits();
                        let result = match &logits {
                            Some(l) => s.distribution(l),
                            None => Err(Error::Candle(candle_core::Error::Msg(
                                s.failure().unwrap_or("the preview was cancelled").into(),
                            ))),
                        };
                        if let Some(at) = self.previews.iter().position(|p| p.0 == s.id) {
                            let _ = self.previews.swap_remove(at).1.send(result);
                        }
                        if let Some(l) = logits {
                            self.preview = Some((s.tokens().to_vec(), l));
                        }
                    }
                    if reason != StopReason::Cancelled {
                        let (tokens, cache) = s.take_cache();
                        self.prefixes.insert(tokens, cache);
                    }
                    self.seqs.remove(i);
                }
            }
        }
        // Keep within the budget as caches grow: kept prefixes give way first, then paused
        // caches, then running answers (see `preempt`).
        if !self.make_room(0) {
            self.preempt();
        }
        self.shared.cache_bytes.store(
            self.seqs.iter().map(Sequence::cache_bytes).sum(),
            Ordering::Relaxed,
        );
        self.shared
            .prefix_bytes
            .store(self.prefixes.bytes(), Ordering::Relaxed);
        if let Ok(mut live) = self.shared.live.lock() {
            live.clear();
            live.extend(
                self.seqs
                    .iter()
                    .filter(|s| !s.is_preview())
                    .map(Sequence::activity),
            );
        }
    }

    /// Applies one command; false means shut down.
    fn apply(&mut self, cmd: Command) -> bool {
        let find = |seqs: &mut Vec<Sequence>, id: u64| seqs.iter_mut().position(|s| s.id == id);
        let seqs = &mut self.seqs;
        match cmd {
            Command::Add(seq) => seqs.push(*seq),
            Command::Preview(job) => {
                let PreviewJob { mut seq, reply } = *job;
                match &self.preview {
                    // The same prompt as last time: only the sampling changed.
                    Some((tokens, logits)) if tokens == seq.tokens() => {
                        let _ = reply.send(seq.distribution(logits));
                    }
                    _ => {
                        self.previews.push((seq.id, reply));
                        seqs.push(seq);
                    }
                }
            }
            Command::SetParams(id, p) => {
                if let Some(i) = find(seqs, id) {
                    // Validated by Control::set_params; a failure here would be a bug.
                    if let Err(e) = seqs[i].sampler_mut().set_params(p) {
                        tracing::warn!(seq = id, error = %e, "rejected sampling change");
                    }
                }
            }
            Command::Pause(id) => {
                if let Some(i) = find(seqs, id) {
                    seqs[i].paused = true;
                }
            }
            Command::Resume(id) => {
                if let Some(i) = find(seqs, id) {
                    seqs[i].paused = false;
                }
            }
            Command::Cancel(id) => {
                if let Some(i) = find(seqs, id) {
                    seqs[i].finish(StopReason::Cancelled);
                }
            }
            Command::SetPriority(id, p) => {
                if let Some(i) = find(seqs, id) {
                    seqs[i].priority = p;
                }
            }
            Command::SetMaxTokens(id, m) => {
                if let Some(i) = find(seqs, id) {
                    seqs[i].set_max_tokens(m);
                }
            }
            Command::SetDraft(d) => self.replace_draft(d),
            #[cfg(test)]
            Command::Panic => panic!("a panic made by a test"),
            Command::Shutdown => {
                for s in seqs.iter_mut() {
                    s.finish(StopReason::Cancelled);
                }
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
