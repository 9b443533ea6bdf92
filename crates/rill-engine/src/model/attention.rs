//! Attention on the host (issue 6): RoPE applied in place, keys and values appended to the
//! sequence's own cache in place, and one fused pass per query and head (scores, softmax,
//! weighted sum of values) over the cache as it lies, with no copy of K or V. The query heads
//! that share a KV head share their passes where there are enough of them for the threads, so
//! each key and value is converted from f16 once for all of them, and a task takes several KV
//! heads side by side, a chunk of positions at a time, where the tasks stay enough for the
//! threads: their runs of each cache row are read together rather than in separate passes.
//!
//! Every query is computed the same way whatever else is in the step or its pass: its scores are
//! summed in a fixed order, its softmax and weighted sum run over its own keys only. So a prompt
//! prefilled in chunks of any size, a token decoded alone or in a batch, all give the same bits,
//! and with the matmul kernels (which have the same property) a seed gives the same text however
//! the scheduler slices the work.
//!
//! The cache of one layer is position-major, `[position][kv head][head_dim]`, so it grows by
//! appending and a prefix is a plain slice.

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;

use super::kv_rows::KvRows;
use crate::kernels::Isa;

/// Heads and sizes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

impl Shape {
    /// Floats per position in a layer's cache (keys or values).
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// How a query's scores are made from its dot products with the keys.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scores<'a> {
    /// Multiplies each `q · k` (`1/√head_dim`, or 1 where the queries were scaled already).
    pub scale: f32,
    /// Caps each scaled score smoothly at ±`c`: `c · tanh(s / c)` (Gemma 2).
    pub softcap: Option<f32>,
    /// Only the last `window` positions, the query's own among them, are attended (a sliding
    /// window layer); `None`: all of them.
    pub window: Option<usize>,
    /// The softmax weights are rounded to f16 before they weigh the values, as llama.cpp's
    /// attention does (its product of the weights with an f16 V converts them). Off for llama,
    /// whose answers stay as they were; on for the other families, where it brings the logits
    /// to llama.cpp's: without it a six-layer Gemma 3 test model drifts by 0.06 from the second
    /// position on.
    pub f16_weights: bool,
    /// Attention sinks (gpt-oss): per query head, a learned logit that joins the softmax's
    /// denominator as if it were the score of one more key whose value is zero (ggml's
    /// `soft_max_ext` with sinks), so a head may attend to nothing.
    pub sinks: Option<&'a [f32]>,
}

impl Scores<'_> {
    /// Llama's: scores scaled by `1/√head_dim`, no cap, the whole context.
    pub fn standard(head_dim: usize) -> Scores<'static> {
        Scores {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
            f16_weights: false,
            sinks: None,
        }
    }
}

/// RoPE tables, `[position][pair]`; `pairs` is `rope.dimension_count / 2`, and dimensions past
/// it pass through unrotated.
pub struct Rope {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub pairs: usize,
    /// Pair dimension `i` with `i + pairs` (llama.cpp's NEOX: Qwen, Gemma, Phi-3) instead of
    /// `2i` with `2i + 1` (llama's, as GGUF's converter permutes its weights).
    pub neox: bool,
}

impl Rope {
    /// Rotates each pair of every head in `heads` (`[n][head_dim]`, one row's queries or keys)
    /// by the angles of position `pos`: adjacent pairs `(x[2i], x[2i+1])` (candle's `rope_i`),
    /// or with [`neox`](Self::neox) halves `(x[i], x[i + pairs])` (candle's `rope`).
    pub fn apply(&self, heads: &mut [f32], head_dim: usize, pos: usize) {
        let at = pos * self.pairs;
        let (cos, sin) = (
            &self.cos[at..at + self.pairs],
            &self.sin[at..at + self.pairs],
        );
        for head in heads.chunks_exact_mut(head_dim) {
            if self.neox {
                let (lo, hi) = head[..2 * self.pairs].split_at_mut(self.pairs);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
                    let (x, y) = (*a, *b);
                    *a = x * c - y * s;
                    *b = x * s + y * c;
                }
                continue;
            }
            for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

impl Rope {
    /// Rotates each head as [`apply`](Self::apply), pair `k` by position `pos[section[k]]`
    /// (M-RoPE: a row's time, height and width; section 3, the extra position, is 0).
    pub fn apply_sections(
        &self,
        heads: &mut [f32],
        head_dim: usize,
        pos: [usize; 3],
        section: &[usize],
    ) {
        let pairs = self.pairs;
        let angle = |k: usize| {
            let p = pos.get(section[k]).copied().unwrap_or(0);
            (self.cos[p * pairs + k], self.sin[p * pairs + k])
        };
        let turns: Vec<(f32, f32)> = (0..pairs).map(angle).collect();
        for head in heads.chunks_exact_mut(head_dim) {
            for (k, &(c, s)) in turns.iter().enumerate() {
                let (i, j) = match self.neox {
                    true => (k, k + pairs),
                    false => (2 * k, 2 * k + 1),
                };
                let (x, y) = (head[i], head[j]);
                head[i] = x * c - y * s;
                head[j] = x * s + y * c;
            }
        }
    }
}

/// `row ← softmax(row)` in place, with the attention's own exponential (SIMD where the CPU
/// has AVX2): what a vision encoder's attention over a block of scores uses (`vision/vit.rs`).
pub fn softmax_in_place(row: &mut [f32], isa: Isa) {
    let total = match isa.checked().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (`Isa::checked`).
        #[cfg(target_arch = "x86_64")]
        true => unsafe { avx2::exp_in_place(row, None) },
        _ => {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().fold(0.0, |sum, v| {
                *v = (*v - max).exp();
                sum + *v
            })
        }
    };
    let inv = 1.0 / total;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Keys and values of one layer for one sequence, `[position][kv head][head_dim]`, in f16 (as
/// llama.cpp keeps them: half the memory and half the reads of f32) or in 8-bit blocks
/// (`kv_rows.rs`). They start at position `start` (0 but in a windowed layer, which drops what
/// its window no longer sees).
#[derive(Default)]
pub struct LayerKv {
    pub k: KvRows,
    pub v: KvRows,
    pub start: usize,
}

/// One sequence's part of a step: `t` new rows (the sequences' rows follow each other in the
/// step's matrices, in the order of the spans), after the `pos` positions its cache held before
/// the step (the new keys and values are already appended).
pub struct Span<'a> {
    pub t: usize,
    pub pos: usize,
    pub kv: &'a LayerKv,
    /// Runs of the new rows (first row, count) that attend to each other both ways: an
    /// image's rows in Gemma 3, which llama.cpp decodes with its causal mask off. A query in a
    /// run sees every key up to the run's end; others see up to their own position.
    pub both_ways: &'a [(usize, usize)],
}

/// Multiply-adds below which a step's attention runs on the calling thread: handing it to the
/// pool costs more than it saves (a short decode step is a few microseconds of work).
const SERIAL_WORK: usize = 1 << 17;

thread_local! {
    /// Scores of the query being computed, reused between queries.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention of every new row of every sequence. Row `r`'s queries (RoPE applied) are
/// `[n_head][head_dim]` from `q[r·q_stride]`; `out` receives `[rows][n_head][head_dim]`.
pub fn attend(
    shape: Shape,
    scores: Scores,
    q: &[f32],
    q_stride: usize,
    spans: &[Span],
    out: &mut [f32],
    isa: Isa,
) {
    let isa = isa.checked();
    let hd = shape.head_dim;
    let q_width = shape.n_head * hd;
    // What the SIMD code below relies on: every query, key and value it reads is there.
    let rows: usize = spans.iter().map(|s| s.t).sum();
    assert!(
        shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head) && q_stride >= q_width
    );
    assert!(
        out.len() == rows * q_width && (rows == 0 || q.len() >= (rows - 1) * q_stride + q_width)
    );
    for s in spans {
        let filled = (s.pos + s.t).saturating_sub(s.kv.start) * shape.kv_width();
        assert!(s.kv.k.len() >= filled && s.kv.v.len() >= filled);
        assert!(s
            .both_ways
            .iter()
            .all(|&(first, count)| first + count <= s.t));
    }
    assert!(scores.sinks.is_none_or(|s| s.len() == shape.n_head));
    // Each chunk of `out` is the query heads of one KV head in one row (they read the same keys
    // and values, converted once for all), or one head where that leaves too few tasks for the
    // threads (a decode step of one row): find its sequence once per row.
    let per_group = shape.n_head / shape.n_kv_head;
    let mut owner = Vec::with_capacity(out.len() / q_width.max(1));
    let mut work = 0;
    for (s, span) in spans.iter().enumerate() {
        for i in 0..span.t {
            // The keys a query sees: the window before it (its own position included), or
            // up to the end of the run of rows it attends to both ways.
            let run_end = span
                .both_ways
                .iter()
                .find(|&&(first, count)| (first..first + count).contains(&i))
                .map_or(0, |&(first, count)| first + count);
            let n = span.pos + (i + 1).max(run_end);
            let first = scores.window.map_or(0, |w| n.saturating_sub(w));
            // The cache holds them all (a windowed layer's first kept row is before them).
            assert!(
                first >= span.kv.start,
                "a query's window starts before its cache"
            );
            owner.push((s, first, n));
            work += (n - first) * q_width;
        }
    }
    let serial = work < SERIAL_WORK;
    let threads = rayon::current_num_threads();
    let heads = match serial || owner.len() * shape.n_kv_head >= 4 * threads {
        true => per_group,
        false => 1,
    };
    // KV heads per task: several side by side where the tasks stay enough for the threads,
    // so that a task's pass reads their runs of each row together (one KV head's run of a
    // position-major row is a few hundred bytes in each kilobyte or more).
    let kv_heads = match heads == per_group && per_group <= 4 {
        true => (1..=shape.n_kv_head)
            .rev()
            .find(|&d| {
                shape.n_kv_head.is_multiple_of(d)
                    && d * per_group <= MAX_HEADS_PER_TASK
                    && (serial || owner.len() * shape.n_kv_head / d >= TASKS_PER_THREAD * threads)
            })
            .unwrap_or(1),
        false => 1,
    };
    let width = heads * kv_heads;
    let one = |(c, y): (usize, &mut [f32])| {
        let (row, first) = (
            c / (shape.n_head / width),
            c % (shape.n_head / width) * width,
        );
        let (s, from, to) = owner[row];
        let q = &q[row * q_stride + first * hd..][..width * hd];
        let g = first / per_group;
        // The sinks of these query heads.
        let sinks = scores.sinks.map(|s| &s[first..first + width]);
        SCORES.with_borrow_mut(|buf| {
            group(
                shape,
                scores,
                sinks,
                q,
                spans[s].kv,
                g..g + kv_heads,
                from..to,
                buf,
                y,
                isa,
            )
        });
    };
    match serial {
        true => out.chunks_exact_mut(width * hd).enumerate().for_each(one),
        false => out
            .par_chunks_exact_mut(width * hd)
            .enumerate()
            .for_each(one),
    }
}

/// Tasks per thread that a step's attention is split into at least, where KV heads are
/// grouped: one, each task as wide as that allows (a 1B-shape decode step at 4,096 positions
/// on two threads: four KV heads a task decoded 31–33 tok/s with the 8-bit cache, two a task
/// 27–30, one 23–24; f16 about even).
const TASKS_PER_THREAD: usize = 1;

/// The most query heads one task takes (the AVX2 passes' room for them).
#[cfg(target_arch = "x86_64")]
const MAX_HEADS_PER_TASK: usize = avx2::MAX_HEADS;
#[cfg(not(target_arch = "x86_64"))]
const MAX_HEADS_PER_TASK: usize = 64;

/// Query heads `q` (`[heads][head_dim]`, their sinks `sinks`) of KV heads `gs`, the same
/// number of query heads for each, over their positions `keys_at`, into `y` (the same shape).
#[allow(clippy::too_many_arguments)]
fn group(
    shape: Shape,
    how: Scores,
    sinks: Option<&[f32]>,
    q: &[f32],
    kv: &LayerKv,
    gs: std::ops::Range<usize>,
    keys_at: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
    y: &mut [f32],
    isa: Isa,
) {
    let (hd, stride) = (shape.head_dim, shape.kv_width());
    let (scale, cap) = (how.scale, (how.softcap, how.f16_weights));
    let n_keys = keys_at.len();
    let at = (keys_at.start - kv.start) * stride + gs.start * hd;
    let heads = q.len() / hd;
    // Query heads of each KV head here.
    let per_kv = heads / gs.len();
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && hd % 8 == 0 {
        // Up to four heads of a KV head at a time: each key and value row is converted once
        // for all of them.
        let rows = (&kv.k, &kv.v, at);
        let mut h = 0;
        while h < heads {
            // Every KV head's heads at once, or (one KV head with more than four) four.
            let (n, all) = match per_kv <= 4 {
                true => (per_kv, heads),
                false => ((heads - h).min(4), (heads - h).min(4)),
            };
            let (qs, ys) = (&q[h * hd..(h + all) * hd], &mut y[h * hd..(h + all) * hd]);
            let cap = (cap.0, cap.1, sinks.map(|s| &s[h..h + all]));
            scores.clear();
            scores.resize(all * n_keys, 0.0);
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C; every
            // key and value row read is `hd` values of these KV heads inside the first
            // `n_keys` positions of the cache (`attend` asserts the cache holds them),
            // `hd % 8 == 0` (and a multiple of 32 in an 8-bit store, whose rows are whole
            // blocks), `all` is at most `MAX_HEADS` (`attend` groups no more), and `qs`, `ys`
            // and `scores` hold `all` heads.
            unsafe {
                match n {
                    4 => avx2::heads::<4>(qs, rows, hd, stride, scale, cap, scores, ys),
                    3 => avx2::heads::<3>(qs, rows, hd, stride, scale, cap, scores, ys),
                    2 => avx2::heads::<2>(qs, rows, hd, stride, scale, cap, scores, ys),
                    _ => avx2::heads::<1>(qs, rows, hd, stride, scale, cap, scores, ys),
                }
            }
            h += all;
        }
        return;
    }
    let _ = isa;
    scores.clear();
    scores.resize(n_keys, 0.0);
    for (h, (q, y)) in q.chunks_exact(hd).zip(y.chunks_exact_mut(hd)).enumerate() {
        let sink = sinks.map(|s| s[h]);
        head(
            q,
            (&kv.k, &kv.v, at + h / per_kv * hd),
            stride,
            scale,
            (cap.0, cap.1, sink),
            scores,
            y,
        );
    }
}

/// `c · tanh(s / c)` for every score: smooth capping at ±c.
fn softcap(scores: &mut [f32], cap: Option<f32>) {
    if let Some(c) = cap {
        for s in scores {
            *s = c * (*s / c).tanh();
        }
    }
}

/// One query head over the keys and values of its KV head (`scores.len()` rows of `stride`
/// values from value `at`), its sink (if any) in the softmax, the scalar reference.
#[allow(clippy::too_many_arguments)]
fn head(
    q: &[f32],
    (keys, values, at): (&KvRows, &KvRows, usize),
    stride: usize,
    scale: f32,
    (cap, f16_weights, sink): (Option<f32>, bool, Option<f32>),
    scores: &mut [f32],
    y: &mut [f32],
) {
    let hd = q.len();
    // Each key and value row is converted as a slice (half's own SIMD where the CPU has it:
    // F16C, or ARM's fp16), not element by element.
    let mut row = vec![0f32; hd];
    for (j, s) in scores.iter_mut().enumerate() {
        keys.read(at + j * stride, &mut row);
        *s = q.iter().zip(&row).map(|(a, b)| a * b).sum::<f32>() * scale;
    }
    softcap(scores, cap);
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // A sink raises the maximum the exponentials are taken from, and adds its own to the sum.
    let max = sink.map_or(max, |s| max.max(s));
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    if let Some(s) = sink {
        sum += (s - max).exp();
    }
    let mut inv = 1.0 / sum;
    if f16_weights {
        for s in scores.iter_mut() {
            *s = f16::from_f32(*s * inv).to_f32();
        }
        inv = 1.0;
    }
    y.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        values.read(at + j * stride, &mut row);
        for (o, &x) in y.iter_mut().zip(&row) {
            *o += p * x;
        }
    }
    y.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(target_arch = "x86_64")]
#[path = "attention_avx2.rs"]
mod avx2;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
