//! The AVX2 passes of our attention (`attention.rs`): up to four query heads of one KV head
//! over its keys and values, each key and value row converted once for all of them, from f16 or
//! from 8-bit blocks, with the rows ahead prefetched.

use super::super::kv_rows::{KvRows, Q8_BLOCK};
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

/// Bytes a value takes in a store: 1 in 8 bits (`Q`), 2 in f16.
const fn elem_bytes<const Q: bool>() -> usize {
    if Q {
        1
    } else {
        2
    }
}

/// Where one store's values start: f16 values, or 8-bit ones and their scales.
#[derive(Clone, Copy)]
struct Src {
    at: *const u8,
    d: *const f16,
}

/// Eight values from value `i` of `s` as f32 (`Q`: an 8-bit store, times its scale; `i` a
/// multiple of 8, so the eight share a block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load<const Q: bool>(s: Src, i: usize) -> __m256 {
    match Q {
        true => {
            let q = _mm_loadl_epi64(s.at.add(i) as *const __m128i);
            let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            let d = _mm_set1_epi16(*(s.d.add(i / Q8_BLOCK) as *const i16));
            _mm256_mul_ps(x, _mm256_cvtph_ps(d))
        }
        false => load8((s.at as *const f16).add(i)),
    }
}

/// `H` query heads of each of `G` consecutive KV heads (`qs`, `[G][H][hd]`, the first KV
/// head's keys and values from value `at`) over `n` keys and values (row j at value
/// `j·stride` of each store): `scores` (`[G][H][n]`) gets `q_h · k_j · scale`, then each
/// head's softmax, and `ys` (`[G][H][hd]`) the weighted sums of the values. Each key and value
/// row is converted (from f16, or from 8 bits times its scales) once for the `H` heads, and
/// the `G` KV heads are taken a chunk of rows at a time, so that a pass reads their `G` runs
/// of each row side by side. Each head's arithmetic is the same whatever `H` and `G` are and
/// whichever keys share a pass, so its bits are too.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn heads<const H: usize>(
    qs: &[f32],
    (keys, values, at): (&KvRows, &KvRows, usize),
    hd: usize,
    stride: usize,
    scale: f32,
    cap: (Option<f32>, bool, Option<&[f32]>),
    scores: &mut [f32],
    ys: &mut [f32],
) {
    // A store's values from value `at` (a head's first, so a block's first in 8 bits).
    let src = |rows: &KvRows| match rows {
        KvRows::F16(x) => Src {
            at: x[at..].as_ptr() as *const u8,
            d: std::ptr::null(),
        },
        KvRows::Q8 { q, d } => Src {
            at: q[at..].as_ptr() as *const u8,
            d: d[at / Q8_BLOCK..].as_ptr(),
        },
    };
    let (k, v) = (src(keys), src(values));
    match (keys, values) {
        (KvRows::F16(_), KvRows::F16(_)) => {
            heads_of::<H, false>(qs, k, v, hd, stride, scale, cap, scores, ys)
        }
        (KvRows::Q8 { .. }, KvRows::Q8 { .. }) => {
            heads_of::<H, true>(qs, k, v, hd, stride, scale, cap, scores, ys)
        }
        // The cache makes a layer's keys and values alike (kv.rs).
        _ => unreachable!("a layer's keys and values are stored alike"),
    }
}

/// `s` moved on by `values` values (whole blocks in 8 bits: a head's size is a multiple of 32
/// there).
#[inline]
fn shift<const Q: bool>(s: Src, values: usize) -> Src {
    Src {
        at: s.at.wrapping_add(values * elem_bytes::<Q>()),
        d: match Q {
            true => s.d.wrapping_add(values / Q8_BLOCK),
            false => s.d,
        },
    }
}

/// The most query heads one call of [`heads`] takes (`G·H`): the stack room for their sums'
/// scales.
pub const MAX_HEADS: usize = 64;

/// [`heads`] over one kind of store.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn heads_of<const H: usize, const Q: bool>(
    qs: &[f32],
    keys: Src,
    values: Src,
    hd: usize,
    stride: usize,
    scale: f32,
    (cap, f16_weights, sinks): (Option<f32>, bool, Option<&[f32]>),
    scores: &mut [f32],
    ys: &mut [f32],
) {
    let all = qs.len() / hd;
    let (groups, n) = (all / H, scores.len() / all);
    assert!(all <= MAX_HEADS && groups * H == all && ys.len() == qs.len());
    // Each KV head's scores, a chunk of keys at a time for all of them.
    let mut from = 0;
    while from < n {
        let to = (from + VALUE_CHUNK).min(n);
        for g in 0..groups {
            let (q, s) = (
                &qs[g * H * hd..][..H * hd],
                &mut scores[g * H * n..][..H * n],
            );
            score_range::<H, Q>(
                q,
                hd,
                shift::<Q>(keys, g * hd),
                stride,
                scale,
                s,
                n,
                from..to,
            );
        }
        from = to;
    }
    let mut inv = [0f32; MAX_HEADS];
    for (h, inv) in inv[..all].iter_mut().enumerate() {
        let s = &mut scores[h * n..(h + 1) * n];
        super::softcap(s, cap);
        *inv = 1.0 / exp_in_place(s, sinks.map(|k| k[h]));
        if f16_weights {
            weights_in_f16(s, *inv);
            *inv = 1.0;
        }
    }
    // Columns in passes of up to eight vectors across the heads, over the values a chunk
    // at a time (every KV head's, side by side), so that the later passes find a chunk's rows
    // in L1; the sums wait in `ys` between chunks, which leaves each column's chain of
    // additions as it was.
    let mut from = 0;
    while from < n {
        let keys_at = from..(from + VALUE_CHUNK).min(n);
        for g in 0..groups {
            let (p, v) = (&scores[g * H * n..][..H * n], shift::<Q>(values, g * hd));
            let mut c = 0;
            while c < hd {
                let y = ys.as_mut_ptr().add(g * H * hd + c);
                let lanes = match (8 / H).min((hd - c) / 8) {
                    8.. => 8,
                    4..=7 => 4,
                    2..=3 => 2,
                    _ => 1,
                };
                let at = (keys_at.clone(), c);
                match lanes {
                    8 => columns::<H, 8, Q>(p, n, v, at, stride, y, hd),
                    4 => columns::<H, 4, Q>(p, n, v, at, stride, y, hd),
                    2 => columns::<H, 2, Q>(p, n, v, at, stride, y, hd),
                    _ => columns::<H, 1, Q>(p, n, v, at, stride, y, hd),
                }
                c += 8 * lanes;
            }
        }
        from = keys_at.end;
    }
    for (y, inv) in ys.chunks_exact_mut(hd).zip(inv) {
        scale_by(y, inv);
    }
}

/// The scores of keys `js` for the `H` heads `qs` (`[H][hd]`) into `scores` (`[H][n]`), in
/// steps of several keys: enough independent FMA chains (keys × heads) to keep both FMA units
/// busy. Each key's score is its own chain, so the steps do not change its bits.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_range<const H: usize, const Q: bool>(
    qs: &[f32],
    hd: usize,
    keys: Src,
    stride: usize,
    scale: f32,
    scores: &mut [f32],
    n: usize,
    js: std::ops::Range<usize>,
) {
    let mut j = js.start;
    if H <= 2 {
        while j + 4 <= js.end {
            score_keys::<H, 4, Q>(qs, hd, keys, stride, scale, scores, n, j);
            j += 4;
        }
    }
    while j + 2 <= js.end {
        score_keys::<H, 2, Q>(qs, hd, keys, stride, scale, scores, n, j);
        j += 2;
    }
    if j < js.end {
        score_keys::<H, 1, Q>(qs, hd, keys, stride, scale, scores, n, j);
    }
}

/// `y ← y · s`, eight at a time (`y.len()` a multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_by(y: &mut [f32], s: f32) {
    for c in y.chunks_exact_mut(8) {
        let v = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), _mm256_set1_ps(s));
        _mm256_storeu_ps(c.as_mut_ptr(), v);
    }
}

/// Values a pass of [`columns`] runs over before the next pass starts: 64 rows of 128
/// values in f16 are 16 KB, half an L1.
const VALUE_CHUNK: usize = 64;

/// Rows ahead of the one being read that a pass asks the memory for: the cache's rows are
/// `stride` values apart, a pattern the hardware's prefetchers follow too late at a few
/// thousand positions (`perf`: the key and value loads stalled half the attention's time
/// at 4,096). With the chunks above: a decode row through 16 layers of a 1B shape at 4,096
/// positions, 48–52 → 39–40 ms (f16), 47–48 → 40–42 ms (8-bit), two threads.
const PREFETCH_ROWS: usize = 48;

/// Asks for the cache lines of the row at value `at` of `s` (`bytes` long): a hint, never a fault,
/// wherever the address falls.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prefetch<const Q: bool>(s: Src, at: usize, bytes: usize) {
    let p = s.at.wrapping_add(at * elem_bytes::<Q>());
    let mut b = 0;
    while b < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(b) as *const i8);
        b += 64;
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
unsafe fn score_keys<const H: usize, const K: usize, const Q: bool>(
    qs: &[f32],
    hd: usize,
    keys: Src,
    stride: usize,
    scale: f32,
    scores: &mut [f32],
    n: usize,
    j: usize,
) {
    let q = qs.as_ptr();
    let k: [usize; K] = std::array::from_fn(|i| (j + i) * stride);
    let row_bytes = hd * elem_bytes::<Q>();
    for r in k {
        prefetch::<Q>(keys, r + PREFETCH_ROWS * stride, row_bytes);
    }
    let mut acc = [[_mm256_setzero_ps(); H]; K];
    let mut c = 0;
    while c < hd {
        let kc: [__m256; K] = std::array::from_fn(|i| load::<Q>(keys, k[i] + c));
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

/// `s ← e^(s − max)` in place, `max` the largest of `s` and the `sink` (if any); returns the
/// sum, the sink's own exponential added last (the scalar head's order).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn exp_in_place(s: &mut [f32], sink: Option<f32>) -> f32 {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = sink.map_or(max, |k| max.max(k));
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
    if let Some(k) = sink {
        total += (k - max).exp();
    }
    total
}

/// `8·L` columns from column `c` of the `H` heads' weighted sums `Σ_j p_h[j] · v_j`
/// (`p_h` at `p[h·n..]`) over values `js`, from `v` into `y` (head h at `y[h·hd..]`),
/// added to what `y` holds unless `js` starts at 0: each value's columns are converted
/// once and added into every head's sums. The first pass over `js` (column 0) asks for the
/// rows ahead.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn columns<const H: usize, const L: usize, const Q: bool>(
    p: &[f32],
    n: usize,
    v: Src,
    (js, c): (std::ops::Range<usize>, usize),
    stride: usize,
    y: *mut f32,
    hd: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); L]; H];
    if js.start > 0 {
        for (h, acc) in acc.iter_mut().enumerate() {
            for (l, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(y.add(h * hd + 8 * l));
            }
        }
    }
    let row_bytes = hd * elem_bytes::<Q>();
    for j in js {
        if c == 0 {
            prefetch::<Q>(v, (j + PREFETCH_ROWS) * stride, row_bytes);
        }
        let vj = j * stride + c;
        let x: [__m256; L] = std::array::from_fn(|l| load::<Q>(v, vj + 8 * l));
        for (h, acc) in acc.iter_mut().enumerate() {
            let w = _mm256_set1_ps(*p.get_unchecked(h * n + j));
            for (a, x) in acc.iter_mut().zip(&x) {
                *a = _mm256_fmadd_ps(w, *x, *a);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        for (l, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(y.add(h * hd + 8 * l), *a);
        }
    }
}
