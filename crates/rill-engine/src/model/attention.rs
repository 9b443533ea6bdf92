//! Attention on the host (issue 6): RoPE applied in place, keys and values appended to the
//! sequence's own cache in place, and one fused pass per query and head (scores, softmax,
//! weighted sum of values) over the cache as it lies, with no copy of K or V. The query heads
//! that share a KV head share their passes where there are enough of them for the threads, so
//! each key and value is converted from f16 once for all of them.
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

use half::{f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

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
pub struct Scores {
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
}

impl Scores {
    /// Llama's: scores scaled by `1/√head_dim`, no cap, the whole context.
    pub fn standard(head_dim: usize) -> Scores {
        Scores {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
            f16_weights: false,
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

/// Keys and values of one layer for one sequence, `[position][kv head][head_dim]`, in f16 (as
/// llama.cpp keeps them): half the memory and half the reads of f32. They start at position
/// `start` (0 but in a windowed layer, which drops what its window no longer sees).
#[derive(Default)]
pub struct LayerKv {
    pub k: Vec<f16>,
    pub v: Vec<f16>,
    pub start: usize,
}

/// One sequence's part of a step: `t` new rows (the sequences' rows follow each other in the
/// step's matrices, in the order of the spans), after the `pos` positions its cache held before
/// the step (the new keys and values are already appended).
pub struct Span<'a> {
    pub t: usize,
    pub pos: usize,
    pub kv: &'a LayerKv,
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
    }
    // Each chunk of `out` is the query heads of one KV head in one row (they read the same keys
    // and values, converted once for all), or one head where that leaves too few tasks for the
    // threads (a decode step of one row): find its sequence once per row.
    let per_group = shape.n_head / shape.n_kv_head;
    let mut owner = Vec::with_capacity(out.len() / q_width.max(1));
    let mut work = 0;
    for (s, span) in spans.iter().enumerate() {
        for i in 0..span.t {
            // The keys a query sees: the window before it (its own position included).
            let n = span.pos + i + 1;
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
    let heads = match serial || owner.len() * shape.n_kv_head >= 4 * rayon::current_num_threads() {
        true => per_group,
        false => 1,
    };
    let one = |(c, y): (usize, &mut [f32])| {
        let (row, first) = (
            c / (shape.n_head / heads),
            c % (shape.n_head / heads) * heads,
        );
        let (s, from, to) = owner[row];
        let q = &q[row * q_stride + first * hd..][..heads * hd];
        let g = first / per_group;
        SCORES
            .with_borrow_mut(|buf| group(shape, scores, q, spans[s].kv, g, from..to, buf, y, isa));
    };
    match serial {
        true => out.chunks_exact_mut(heads * hd).enumerate().for_each(one),
        false => out
            .par_chunks_exact_mut(heads * hd)
            .enumerate()
            .for_each(one),
    }
}

/// Query heads `q` (`[heads][head_dim]`) of KV head `g` over its positions `keys_at`, into `y`
/// (the same shape).
#[allow(clippy::too_many_arguments)]
fn group(
    shape: Shape,
    how: Scores,
    q: &[f32],
    kv: &LayerKv,
    g: usize,
    keys_at: std::ops::Range<usize>,
    scores: &mut Vec<f32>,
    y: &mut [f32],
    isa: Isa,
) {
    let (hd, stride) = (shape.head_dim, shape.kv_width());
    let (scale, cap) = (how.scale, (how.softcap, how.f16_weights));
    let n_keys = keys_at.len();
    let at = (keys_at.start - kv.start) * stride + g * hd;
    let (keys, values) = (&kv.k[at..], &kv.v[at..]);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && hd % 8 == 0 {
        // Up to four heads at a time: each key and value row is converted from f16 once for
        // all of them.
        let heads = q.len() / hd;
        let mut h = 0;
        while h < heads {
            let n = (heads - h).min(4);
            let (qs, ys) = (&q[h * hd..(h + n) * hd], &mut y[h * hd..(h + n) * hd]);
            scores.clear();
            scores.resize(n * n_keys, 0.0);
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C; every
            // key and value row read is `hd` values inside the first `n_keys` positions of the
            // cache (`attend` asserts the cache holds them), `hd % 8 == 0`, and `qs`, `ys` and
            // `scores` hold `n` heads.
            unsafe {
                match n {
                    4 => avx2::heads::<4>(qs, keys, values, stride, scale, cap, scores, ys),
                    3 => avx2::heads::<3>(qs, keys, values, stride, scale, cap, scores, ys),
                    2 => avx2::heads::<2>(qs, keys, values, stride, scale, cap, scores, ys),
                    _ => avx2::heads::<1>(qs, keys, values, stride, scale, cap, scores, ys),
                }
            }
            h += n;
        }
        return;
    }
    let _ = isa;
    scores.clear();
    scores.resize(n_keys, 0.0);
    for (q, y) in q.chunks_exact(hd).zip(y.chunks_exact_mut(hd)) {
        head(q, keys, values, stride, scale, cap, scores, y);
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

/// One query head over the keys and values of its KV head (`scores.len()` rows of `stride`),
/// the scalar reference.
#[allow(clippy::too_many_arguments)]
fn head(
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    stride: usize,
    scale: f32,
    (cap, f16_weights): (Option<f32>, bool),
    scores: &mut [f32],
    y: &mut [f32],
) {
    let hd = q.len();
    // Each key and value row is converted as a slice (half's own SIMD where the CPU has it:
    // F16C, or ARM's fp16), not element by element.
    let mut row = vec![0f32; hd];
    for (j, s) in scores.iter_mut().enumerate() {
        keys[j * stride..][..hd].convert_to_f32_slice(&mut row);
        *s = q.iter().zip(&row).map(|(a, b)| a * b).sum::<f32>() * scale;
    }
    softcap(scores, cap);
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
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
        values[j * stride..][..hd].convert_to_f32_slice(&mut row);
        for (o, &x) in y.iter_mut().zip(&row) {
            *o += p * x;
        }
    }
    y.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::ops::avx2::exp;
    use half::f16;
    use std::arch::x86_64::*;

    /// Eight f16 from `p` as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// The sum of a vector's lanes, always in the same order: ((0+1)+(2+3)) + ((4+5)+(6+7)).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let h = _mm256_hadd_ps(v, v);
        let h = _mm256_hadd_ps(h, h);
        _mm_cvtss_f32(_mm_add_ss(
            _mm256_castps256_ps128(h),
            _mm256_extractf128_ps(h, 1),
        ))
    }

    /// The four sums of `a`, `b`, `c` and `d`'s lanes, each added in [`hsum`]'s order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sums4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
    }

    /// `H` query heads (`qs`, `[H][hd]`) of one KV head over `n` keys and values (row j at
    /// `keys[j·stride..]`, `values[j·stride..]`): `scores` (`[H][n]`) gets `q_h · k_j · scale`,
    /// then each head's softmax, and `ys` (`[H][hd]`) the weighted sums of the values. Each key
    /// and value row is converted from f16 once for the `H` heads, and each head's arithmetic
    /// is the same whatever `H` is and whichever keys share a pass, so its bits are too.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn heads<const H: usize>(
        qs: &[f32],
        keys: &[f16],
        values: &[f16],
        stride: usize,
        scale: f32,
        (cap, f16_weights): (Option<f32>, bool),
        scores: &mut [f32],
        ys: &mut [f32],
    ) {
        let (hd, n) = (qs.len() / H, scores.len() / H);
        let mut j = 0;
        // Enough independent FMA chains (keys × heads) to keep both FMA units busy.
        if H <= 2 {
            while j + 4 <= n {
                score_keys::<H, 4>(qs, hd, keys.as_ptr(), stride, scale, scores, n, j);
                j += 4;
            }
        }
        while j + 2 <= n {
            score_keys::<H, 2>(qs, hd, keys.as_ptr(), stride, scale, scores, n, j);
            j += 2;
        }
        if j < n {
            score_keys::<H, 1>(qs, hd, keys.as_ptr(), stride, scale, scores, n, j);
        }
        super::softcap(scores, cap);
        let mut inv = [0f32; H];
        for (h, inv) in inv.iter_mut().enumerate() {
            let s = &mut scores[h * n..(h + 1) * n];
            *inv = 1.0 / exp_in_place(s);
            if f16_weights {
                weights_in_f16(s, *inv);
                *inv = 1.0;
            }
        }
        // Columns in passes of up to eight vectors across the heads.
        let mut c = 0;
        while c < hd {
            let (v, y) = (values.as_ptr().add(c), ys.as_mut_ptr().add(c));
            let lanes = match (8 / H).min((hd - c) / 8) {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
            match lanes {
                8 => columns::<H, 8>(scores, n, v, stride, &inv, y, hd),
                4 => columns::<H, 4>(scores, n, v, stride, &inv, y, hd),
                2 => columns::<H, 2>(scores, n, v, stride, &inv, y, hd),
                _ => columns::<H, 1>(scores, n, v, stride, &inv, y, hd),
            }
            c += 8 * lanes;
        }
    }

    /// `s[j] = f16(s[j] · inv)` (as a float), the scalar head's rounding, eight at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weights_in_f16(s: &mut [f32], inv: f32) {
        let (n, v) = (s.len(), _mm256_set1_ps(inv));
        let mut j = 0;
        while j + 8 <= n {
            let p = s.as_mut_ptr().add(j);
            let w = _mm256_cvtps_ph(
                _mm256_mul_ps(_mm256_loadu_ps(p), v),
                _MM_FROUND_TO_NEAREST_INT,
            );
            _mm256_storeu_ps(p, _mm256_cvtph_ps(w));
            j += 8;
        }
        for x in &mut s[j..] {
            *x = f16::from_f32(*x * inv).to_f32();
        }
    }

    /// The scores of keys `j..j+K` for the `H` heads: per (key, head) an FMA chain over the
    /// columns (the first a multiply), then its horizontal sum in [`hsum`]'s order, times
    /// `scale`.
    // Indexed by key and head: clearer than zipped iterators here.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn score_keys<const H: usize, const K: usize>(
        qs: &[f32],
        hd: usize,
        keys: *const f16,
        stride: usize,
        scale: f32,
        scores: &mut [f32],
        n: usize,
        j: usize,
    ) {
        let q = qs.as_ptr();
        let k: [*const f16; K] = std::array::from_fn(|i| keys.add((j + i) * stride));
        let mut acc = [[_mm256_setzero_ps(); H]; K];
        let mut c = 0;
        while c < hd {
            let kc: [__m256; K] = std::array::from_fn(|i| load8(k[i].add(c)));
            for h in 0..H {
                let qh = _mm256_loadu_ps(q.add(h * hd + c));
                for i in 0..K {
                    acc[i][h] = match c {
                        0 => _mm256_mul_ps(qh, kc[i]),
                        _ => _mm256_fmadd_ps(qh, kc[i], acc[i][h]),
                    };
                }
            }
            c += 8;
        }
        // Four sums at a time (the last group padded with its own last accumulator).
        let all = K * H;
        let pick = |i: usize| {
            let i = i.min(all - 1);
            acc[i / H][i % H]
        };
        let mut out = [0f32; 20];
        for base in (0..all).step_by(4) {
            let r = sums4(pick(base), pick(base + 1), pick(base + 2), pick(base + 3));
            _mm_storeu_ps(
                out.as_mut_ptr().add(base),
                _mm_mul_ps(r, _mm_set1_ps(scale)),
            );
        }
        for (i, &v) in out[..all].iter().enumerate() {
            scores[(i % H) * n + j + i / H] = v;
        }
    }

    /// `s ← e^(s − max s)` in place; returns the sum.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_in_place(s: &mut [f32]) -> f32 {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = s.chunks_exact_mut(8);
        for c in &mut chunks {
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
        }
        let mut total = hsum(sum);
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut buf = [f32::NEG_INFINITY; 8];
            buf[..rest.len()].copy_from_slice(rest);
            let e = exp(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), m));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
            rest.copy_from_slice(&buf[..rest.len()]);
            total += rest.iter().sum::<f32>();
        }
        total
    }

    /// `8·L` columns of the `H` heads' weighted sums, `y_h = inv_h · Σ_j p_h[j] · v_j` (`p_h`
    /// at `p[h·n..]`), from `v` (value 0's first column) into `y` (head h at `y[h·hd..]`): each
    /// value's columns are converted once and added into every head's sums.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn columns<const H: usize, const L: usize>(
        p: &[f32],
        n: usize,
        v: *const f16,
        stride: usize,
        inv: &[f32; H],
        y: *mut f32,
        hd: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); L]; H];
        for j in 0..n {
            let vj = v.add(j * stride);
            let x: [__m256; L] = std::array::from_fn(|l| load8(vj.add(8 * l)));
            for (h, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_ps(*p.get_unchecked(h * n + j));
                for (a, x) in acc.iter_mut().zip(&x) {
                    *a = _mm256_fmadd_ps(w, *x, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (l, a) in acc.iter().enumerate() {
                let out = y.add(h * hd + 8 * l);
                _mm256_storeu_ps(out, _mm256_mul_ps(*a, _mm256_set1_ps(inv[h])));
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
