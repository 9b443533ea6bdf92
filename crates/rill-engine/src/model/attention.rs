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
/// llama.cpp keeps them): half the memory and half the reads of f32.
#[derive(Default)]
pub struct LayerKv {
    pub k: Vec<f16>,
    pub v: Vec<f16>,
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
pub fn attend(shape: Shape, q: &[f32], q_stride: usize, spans: &[Span], out: &mut [f32], isa: Isa) {
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
        let filled = (s.pos + s.t) * shape.kv_width();
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
            owner.push((s, span.pos + i + 1));
            work += (span.pos + i + 1) * q_width;
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
        let (s, n_keys) = owner[row];
        let q = &q[row * q_stride + first * hd..][..heads * hd];
        let g = first / per_group;
        SCORES.with_borrow_mut(|scores| group(shape, q, spans[s].kv, g, n_keys, scores, y, isa));
    };
    match serial {
        true => out.chunks_exact_mut(heads * hd).enumerate().for_each(one),
        false => out
            .par_chunks_exact_mut(heads * hd)
            .enumerate()
            .for_each(one),
    }
}

/// Query heads `q` (`[heads][head_dim]`) of KV head `g` over its first `n_keys` positions, into
/// `y` (the same shape).
#[allow(clippy::too_many_arguments)]
fn group(
    shape: Shape,
    q: &[f32],
    kv: &LayerKv,
    g: usize,
    n_keys: usize,
    scores: &mut Vec<f32>,
    y: &mut [f32],
    isa: Isa,
) {
    let (hd, stride) = (shape.head_dim, shape.kv_width());
    let scale = 1.0 / (hd as f32).sqrt();
    let keys = &kv.k[g * hd..];
    let values = &kv.v[g * hd..];
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
                    4 => avx2::heads::<4>(qs, keys, values, stride, scale, scores, ys),
                    3 => avx2::heads::<3>(qs, keys, values, stride, scale, scores, ys),
                    2 => avx2::heads::<2>(qs, keys, values, stride, scale, scores, ys),
                    _ => avx2::heads::<1>(qs, keys, values, stride, scale, scores, ys),
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
        head(q, keys, values, stride, scale, scores, y);
    }
}

/// One query head over the keys and values of its KV head (`scores.len()` rows of `stride`),
/// the scalar reference.
fn head(
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    stride: usize,
    scale: f32,
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
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    y.fill(0.0);
    for (j, &p) in scores.iter().enumerate() {
        values[j * stride..][..hd].convert_to_f32_slice(&mut row);
        for (o, &x) in y.iter_mut().zip(&row) {
            *o += p * x;
        }
    }
    let inv = 1.0 / sum;
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
        let mut inv = [0f32; H];
        for (h, inv) in inv.iter_mut().enumerate() {
            *inv = 1.0 / exp_in_place(&mut scores[h * n..(h + 1) * n]);
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
mod tests {
    use super::*;
    use crate::kernels::tests::Lcg;

    fn cache(rng: &mut Lcg, positions: usize, width: usize) -> LayerKv {
        let mut f = |n| rng.vec(n).into_iter().map(f16::from_f32).collect();
        LayerKv {
            k: f(positions * width),
            v: f(positions * width),
        }
    }

    /// softmax(q·kᵀ/√d)·v in f64, straight from the definition.
    fn reference(shape: Shape, q: &[f32], kv: &LayerKv, head: usize, n_keys: usize) -> Vec<f64> {
        let hd = shape.head_dim;
        let g = head / (shape.n_head / shape.n_kv_head);
        let at = |x: &[f16], j: usize| x[j * shape.kv_width() + g * hd..][..hd].to_vec();
        let s: Vec<f64> = (0..n_keys)
            .map(|j| {
                let k = at(&kv.k, j);
                q.iter()
                    .zip(&k)
                    .map(|(a, b)| *a as f64 * b.to_f64())
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        (0..hd)
            .map(|c| {
                (0..n_keys)
                    .map(|j| e[j] * at(&kv.v, j)[c].to_f64())
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    #[test]
    fn every_path_equals_the_definition() {
        let mut rng = Lcg(7);
        // Head sizes: this model's 64 (three query heads per KV head), 24 (not a multiple of 32;
        // one head per KV head), 32 with eight heads on one KV head (two passes of four), 16
        // with two, 40 with seven (four and three), and 20 (scalar only).
        for (hd, n_head, n_kv) in [
            (64, 9, 3),
            (24, 4, 4),
            (32, 8, 1),
            (16, 6, 3),
            (40, 7, 1),
            (20, 2, 1),
        ] {
            let shape = Shape {
                n_head,
                n_kv_head: n_kv,
                head_dim: hd,
            };
            // Ragged lengths: under and over a vector, and long enough to go to the pool.
            for (pos, t) in [(0, 1), (6, 3), (8, 1), (300, 5), (2000, 2)] {
                let kv = cache(&mut rng, pos + t, shape.kv_width());
                let q = rng.vec(t * n_head * hd);
                let spans = [Span { t, pos, kv: &kv }];
                for isa in crate::kernels::Isa::available() {
                    let mut out = vec![0f32; t * n_head * hd];
                    attend(shape, &q, n_head * hd, &spans, &mut out, isa);
                    for (c, y) in out.chunks_exact(hd).enumerate() {
                        let (i, head) = (c / n_head, c % n_head);
                        let want = reference(shape, &q[c * hd..][..hd], &kv, head, pos + i + 1);
                        for (a, b) in y.iter().zip(&want) {
                            assert!(
                                (*a as f64 - b).abs() < 1e-5,
                                "{isa:?} hd {hd} pos {pos} row {i} head {head}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_query_gives_the_same_bits_in_any_step() {
        // The same 12 rows of one sequence run as one step, as steps of 5, and one by one, and
        // beside another sequence: each row's output is identical.
        let mut rng = Lcg(11);
        let shape = Shape {
            n_head: 9,
            n_kv_head: 3,
            head_dim: 64,
        };
        let (pos, rows, qw) = (700, 12, 9 * 64);
        let kv = cache(&mut rng, pos + rows, shape.kv_width());
        let other = cache(&mut rng, 40, shape.kv_width());
        let q = rng.vec(rows * qw);
        for isa in crate::kernels::Isa::available() {
            let run = |from: usize, t: usize, beside: bool| {
                let mut spans = Vec::new();
                let mut qs = Vec::new();
                if beside {
                    spans.push(Span {
                        t: 1,
                        pos: 39,
                        kv: &other,
                    });
                    qs.extend(rng_free_row(qw));
                }
                spans.push(Span {
                    t,
                    pos: pos + from,
                    kv: &kv,
                });
                qs.extend_from_slice(&q[from * qw..(from + t) * qw]);
                let mut out = vec![0f32; qs.len()];
                attend(shape, &qs, qw, &spans, &mut out, isa);
                out[out.len() - t * qw..].to_vec()
            };
            let whole = run(0, rows, false);
            let mut fives = Vec::new();
            for from in (0..rows).step_by(5) {
                fives.extend(run(from, 5.min(rows - from), false));
            }
            let singles: Vec<f32> = (0..rows).flat_map(|i| run(i, 1, i % 2 == 0)).collect();
            assert!(
                whole == fives && whole == singles,
                "{isa:?}: a row depends on its step"
            );
        }
    }

    /// The heads of a KV group share their passes over its keys and values; each head's output
    /// is the same, bit for bit, as when it runs alone.
    #[test]
    fn a_head_gives_the_same_bits_alone_and_in_its_group() {
        let mut rng = Lcg(17);
        for (hd, n_head, n_kv) in [(64, 9, 3), (32, 8, 1), (40, 7, 1), (16, 6, 3)] {
            let shape = Shape {
                n_head,
                n_kv_head: n_kv,
                head_dim: hd,
            };
            let alone = Shape {
                n_head: 1,
                n_kv_head: 1,
                head_dim: hd,
            };
            let per_group = n_head / n_kv;
            for n_keys in [1, 2, 5, 37] {
                let kv = cache(&mut rng, n_keys, shape.kv_width());
                let q = rng.vec(n_head * hd);
                let spans = [Span {
                    t: 1,
                    pos: n_keys - 1,
                    kv: &kv,
                }];
                for isa in crate::kernels::Isa::available() {
                    let mut together = vec![0f32; n_head * hd];
                    attend(shape, &q, n_head * hd, &spans, &mut together, isa);
                    for head in 0..n_head {
                        // A cache of this head's KV head only.
                        let g = head / per_group;
                        let own = |x: &[f16]| -> Vec<f16> {
                            x.chunks_exact(shape.kv_width())
                                .flat_map(|row| row[g * hd..(g + 1) * hd].to_vec())
                                .collect()
                        };
                        let kv1 = LayerKv {
                            k: own(&kv.k),
                            v: own(&kv.v),
                        };
                        let span = [Span {
                            t: 1,
                            pos: n_keys - 1,
                            kv: &kv1,
                        }];
                        let mut y = vec![0f32; hd];
                        attend(alone, &q[head * hd..][..hd], hd, &span, &mut y, isa);
                        assert!(
                            y == together[head * hd..][..hd],
                            "{isa:?} hd {hd} {n_head}/{n_kv} heads, {n_keys} keys: head {head}"
                        );
                    }
                }
            }
        }
    }

    fn rng_free_row(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
    }

    #[test]
    fn rope_rotates_like_candle() {
        for neox in [false, true] {
            rope_rotates_like_candles(neox);
        }
    }

    fn rope_rotates_like_candles(neox: bool) {
        let mut rng = Lcg(3);
        let (t, heads, hd, pos, pairs) = (3, 2, 8, 5, 4);
        let cos: Vec<f32> = (0..(pos + t) * pairs)
            .map(|i| (i as f32 * 0.1).cos())
            .collect();
        let sin: Vec<f32> = (0..(pos + t) * pairs)
            .map(|i| (i as f32 * 0.1).sin())
            .collect();
        let rope = Rope {
            cos: cos.clone(),
            sin: sin.clone(),
            pairs,
            neox,
        };
        let x = rng.vec(t * heads * hd);
        let mut ours = x.clone();
        for (i, row) in ours.chunks_exact_mut(heads * hd).enumerate() {
            rope.apply(row, hd, pos + i);
        }
        let dev = candle_core::Device::Cpu;
        let table = |v: &[f32]| {
            candle_core::Tensor::from_slice(&v[pos * pairs..], (t, pairs), &dev).unwrap()
        };
        let xt = candle_core::Tensor::from_slice(&x, (1, t, heads, hd), &dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        let rotate = match neox {
            true => candle_nn::rotary_emb::rope,
            false => candle_nn::rotary_emb::rope_i,
        };
        let theirs = rotate(&xt, &table(&cos), &table(&sin))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(ours, theirs);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_exp_is_within_an_ulp() {
        if !crate::kernels::Isa::detect().avx2() {
            return;
        }
        let xs: Vec<f32> = (0..20_000).map(|i| -90.0 + i as f32 * 0.0045).collect();
        let mut ys = xs.clone();
        let max = 0.0f32;
        ys.push(max);
        // SAFETY: AVX2, FMA and F16C were detected above.
        unsafe { avx2::exp_in_place(&mut ys) };
        for (x, y) in xs.iter().zip(&ys) {
            let want = (*x as f64).exp();
            if want < f32::MIN_POSITIVE as f64 * 4.0 {
                assert!(*y < 1e-36, "e^{x}: {y}");
                continue;
            }
            let ulp = f32::EPSILON as f64 * want;
            assert!((*y as f64 - want).abs() <= ulp, "e^{x}: {y} vs {want}");
        }
    }
}
