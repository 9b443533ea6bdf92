//! The matmul driver: activations quantised once per row, then the weight rows or panels
//! split across the pool (by weight rows for a few activation rows, by activation rows for
//! many), each output summed in the same order whatever rows are beside it.

use super::*;

/// The tiles of [`Format::rows`] on AVX2 for one format: `(isa, w, acts, is, out, sj, si)`,
/// `isa` the matrix's (a format whose tiles come in more than the two forms of `ROWS_AVX2`
/// picks among them by it).
///
/// # Safety
/// AVX2, FMA and F16C (and AVX-VNNI for the VNNI one), `isa` checked; the bounds
/// [`Format::rows`] asserts.
#[cfg(target_arch = "x86_64")]
pub(crate) type RowsFn<F, A> =
    unsafe fn(Isa, &[F], &Acts<A>, std::ops::Range<usize>, &mut [f32], usize, usize);

/// An activation block format: how a row of activations is quantised into it (ggml's
/// quantisation, bit for bit), and its scales. The weight formats name theirs
/// ([`Format::Act`], [`Panel::Act`]).
pub(crate) trait Quantise: Copy + Default + Send + Sync {
    /// Activations per block: 32, or 256 for the K-quants' Q8_K.
    const ACT_QK: usize = QK;
    /// ggml's quantisation of an activation row, the scalar reference.
    const QUANTIZE: fn(&[f32], &mut [Self]);
    /// The same with AVX2, bit for bit (needs AVX2, FMA and F16C).
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [Self]);
    /// An activation row quantised with the best of `isa`.
    fn quantize(isa: Isa, x: &[f32], out: &mut [Self]) {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C.
            return unsafe { (Self::QUANTIZE_AVX2)(x, out) };
        }
        let _ = isa;
        (Self::QUANTIZE)(x, out)
    }
    /// `(d, s)` of the block (`s` = d·Σq, or 0 when the format has none), `t` the f16 table.
    fn scales(&self, t: &[f32]) -> (f32, f32);
}

impl Quantise for BlockQ8_1 {
    const QUANTIZE: fn(&[f32], &mut [BlockQ8_1]) = quantize_q8_1;
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [BlockQ8_1]) = avx2::quantize_q8_1;
    fn scales(&self, t: &[f32]) -> (f32, f32) {
        (h(t, self.d), h(t, self.s))
    }
}

impl Quantise for BlockQ8_0 {
    const QUANTIZE: fn(&[f32], &mut [BlockQ8_0]) = quantize_q8_0;
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [BlockQ8_0]) = avx2::quantize_q8_0;
    fn scales(&self, t: &[f32]) -> (f32, f32) {
        (h(t, self.d), 0.0)
    }
}

/// The K-quants' activations: Q8_K, one scale per 256 (its `d`, which the K-quant tiles read
/// from the driver's `d`; they take no `s`).
impl Quantise for BlockQ8K {
    const ACT_QK: usize = QK_K;
    const QUANTIZE: fn(&[f32], &mut [BlockQ8K]) = quantize_q8_k;
    #[cfg(target_arch = "x86_64")]
    const QUANTIZE_AVX2: unsafe fn(&[f32], &mut [BlockQ8K]) = quantize_q8_k_avx2;
    fn scales(&self, _: &[f32]) -> (f32, f32) {
        (self.d, 0.0)
    }
}

/// A weight block format the kernels run row by row (Q4_1, Q8_0, Q4_0, MXFP4, and the
/// K-quants' super-blocks in `krows.rs`), dotted with activation blocks of its [`Act`](Self::Act).
pub(crate) trait Format: Copy + Sync {
    /// The activation blocks it is dotted with.
    type Act: Quantise;
    /// The tiles of [`rows`](Self::rows) on AVX2: without AVX-VNNI, and with it (the same
    /// function twice for a format that picks by the `Isa` it is given).
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, Self::Act>; 2];
    /// With an `isa` already [`checked`](Isa::checked) (the matrix's).
    fn dot(isa: Isa, w: &[Self], a: &[Self::Act]) -> f32;
    /// Every weight row `j` of `w` (whole rows of `a.len()` blocks) dotted with the one
    /// activation row `a`, into `out[j]`: a one-row step's product. Each output is
    /// [`dot`](Self::dot)'s bits; a format may take several weight rows at once for that.
    fn dots(isa: Isa, w: &[Self], a: &[Self::Act], out: &mut [f32]) {
        let kb = a.len();
        for (j, o) in out.iter_mut().enumerate() {
            *o = Self::dot(isa, &w[j * kb..(j + 1) * kb], a);
        }
    }
    /// Every weight row `j` of `w` (whole rows of `acts.kb` blocks) dotted with every
    /// activation row `i` in `is`, into `out[j·sj + (i - is.start)·si]`.
    fn rows(
        isa: Isa,
        w: &[Self],
        acts: &Acts<Self::Act>,
        is: std::ops::Range<usize>,
        out: &mut [f32],
        sj: usize,
        si: usize,
    ) {
        let kb = acts.kb;
        let n = w.len() / kb;
        assert!(w.len().is_multiple_of(kb) && is.start < is.end && is.end * kb <= acts.q.len());
        assert!(acts.d.len() == acts.q.len() && acts.s.len() >= kb * acts.stride);
        assert!(is.start.is_multiple_of(TILE_A) && acts.stride >= is.end.div_ceil(TILE_A) * TILE_A);
        assert!(n == 0 || (n - 1) * sj + (is.len() - 1) * si < out.len());
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            let tiles = Self::ROWS_AVX2[usize::from(isa.avx_vnni())];
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C (and
            // AVX-VNNI where `avx_vnni()`, which picks the VNNI tiles); every row, scale (tiles
            // start at whole tiles and `s` is padded to whole tiles) and output the tiles touch
            // is inside the bounds asserted above.
            return unsafe { tiles(isa, w, acts, is, out, sj, si) };
        }
        // Otherwise the dot product pair by pair (the scalar reference, or NEON's, which gives
        // the same bits): the same numbers a row gets alone.
        for j in 0..n {
            for i in is.clone() {
                let (x, y) = (&w[j * kb..(j + 1) * kb], &acts.q[i * kb..(i + 1) * kb]);
                out[j * sj + (i - is.start) * si] = Self::dot(isa, x, y);
            }
        }
    }
}

impl Format for BlockQ4_1 {
    type Act = BlockQ8_1;
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_1>; 2] =
        [avx2::rows_q4_1::<false>, avx2::rows_q4_1::<true>];
    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_1]) -> f32 {
        isa.dot_q4_1_q8_1_checked(w, a)
    }
}

/// Q4_0 as the file holds it: Q4_1's arithmetic with `m = −8·d`.
impl Format for BlockQ4_0 {
    type Act = BlockQ8_1;
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_1>; 2] = [avx2::rows_q4_0_file, avx2::rows_q4_0_file];
    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_1]) -> f32 {
        isa.dot_q4_0_q8_1_checked(w, a)
    }
    fn dots(isa: Isa, w: &[Self], a: &[BlockQ8_1], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: `avx2()` ISAs are only chosen when the CPU has AVX2, FMA and F16C, and
            // `isa` is the matrix's, checked; the kernel asserts `w` holds `out.len()` rows.
            return unsafe { avx2::dots_q4_0_q8_1(isa, w, a, out) };
        }
        let kb = a.len();
        for (j, o) in out.iter_mut().enumerate() {
            *o = Self::dot(isa, &w[j * kb..(j + 1) * kb], a);
        }
    }
}

impl Format for BlockQ8_0 {
    type Act = BlockQ8_0;
    #[cfg(target_arch = "x86_64")]
    const ROWS_AVX2: [RowsFn<Self, BlockQ8_0>; 2] =
        [avx2::rows_q8_0::<false>, avx2::rows_q8_0::<true>];
    fn dot(isa: Isa, w: &[Self], a: &[BlockQ8_0]) -> f32 {
        isa.dot_q8_0_q8_0_checked(w, a)
    }
}

/// Activations quantised once per call, with their blocks' scales as f32: `d` row-major,
/// `s` block-major with a stride of `m` rounded up to a whole tile (zeros after the last row).
pub(crate) struct Acts<A> {
    pub(crate) q: Vec<A>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) stride: usize,
    pub(crate) kb: usize,
}

/// Activation rows per tile: each weight block is unpacked once for 4 activation rows.
pub(crate) const TILE_A: usize = 4;

/// Activation rows per tile of the AVX-512 kernels: twelve, so that a draft's check of up to
/// eleven tokens unpacks each weight block once, and a prompt's rows a third as often as in
/// tiles of four (the K-quants' unpacking costs most: Q6_K's products of 64 rows took 12% less
/// time).
pub(crate) const TILE_A_WIDER: usize = 12;

/// Activation rows per task when a call has many (a prefill chunk).
pub(crate) const ACT_ROWS_PER_TASK: usize = 32;

/// The `m` rows of `x` (`k` wide) quantised for format `F`; across the threads when there are
/// many.
pub(crate) fn quantize_rows<A: Quantise>(isa: Isa, x: &[f32], m: usize, k: usize) -> Vec<A> {
    let kb = k / A::ACT_QK;
    let mut q = vec![A::default(); m * kb];
    if m < ACT_ROWS_PER_TASK {
        for (row, q) in x.chunks_exact(k).zip(q.chunks_exact_mut(kb)) {
            A::quantize(isa, row, q);
        }
    } else {
        x.par_chunks_exact(k)
            .zip(q.par_chunks_exact_mut(kb))
            .with_min_len(ACT_ROWS_PER_TASK / 2)
            .for_each(|(row, q)| A::quantize(isa, row, q));
    }
    q
}

/// A pointer the tasks of one matmul share, each writing outputs no other task writes.
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: only used by `panels_times` and `half_times`, whose tasks write disjoint elements
// (see there).
unsafe impl Sync for SharedOut {}

/// [`rows_times`] for matrices in panels (made only for x86's SIMD: see
/// `QLinear::from_qtensor`). Every split runs the same panel kernel, which sums each output in
/// the same order whatever rows are beside it, so a row's output is the same alone, in a batch
/// or in a prefill chunk.
pub(crate) fn panels_times<P: Kernel>(
    isa: Isa,
    w: &[P],
    x: &[f32],
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    // A panel's block is as wide as an activation block (32, or 256 for the K-quants).
    let kb = k / P::Act::ACT_QK;
    let n_out = w.len() / kb * P::ROWS;
    let q = quantize_rows::<P::Act>(isa, x, m, k);
    let t = f16_table();
    let (d, s): (Vec<f32>, Vec<f32>) = q.iter().map(|a| a.scales(t)).unzip();
    let mut acts = PanelActs { q, d, s, kb };
    let panels = n_out / P::ROWS;
    // Panels per task when a call splits the weight rows: `ROWS_PER_TASK` rows.
    let per_task = ROWS_PER_TASK / P::ROWS;
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        P::prepare(&mut acts.q);
        let (acts, kernel) = (&acts, P::kernel(isa));
        let run = |ps: std::ops::Range<usize>, is: std::ops::Range<usize>, o: *mut f32| {
            // SAFETY: the matrix's `isa` is `checked`, and its panels are only made where that
            // `isa` runs their kernel (`from_qtensor`); `ps` and `is` are within the panels and
            // rows, and `o` points at the output of row `is.start` (column 0) of a row-major
            // buffer `n_out` wide holding rows `is`.
            unsafe { kernel(w, acts, ps, is, o, n_out) }
        };
        if m >= 2 * ACT_ROWS_PER_TASK {
            // Many rows: each task its own activation rows (and so its own output rows).
            out.par_chunks_mut(ACT_ROWS_PER_TASK * n_out)
                .enumerate()
                .for_each(|(task, chunk)| {
                    let first = task * ACT_ROWS_PER_TASK;
                    let rows = chunk.len() / n_out;
                    run(0..panels, first..first + rows, chunk.as_mut_ptr());
                });
        } else {
            // A few rows: each task its own panels, i.e. its own 64 columns of every row, so
            // no two tasks write the same element of `out`.
            assert_eq!(out.len(), m * n_out);
            let o = SharedOut(out.as_mut_ptr());
            let o = &o;
            (0..panels.div_ceil(per_task))
                .into_par_iter()
                .for_each(|task| {
                    let ps = task * per_task..((task + 1) * per_task).min(panels);
                    run(ps, 0..m, o.0);
                });
        }
        return;
    }
    // Panels are only made for x86's SIMD; should one reach here, the scalar dot product per
    // pair.
    for (i, row) in out.chunks_exact_mut(n_out).enumerate() {
        let a = &acts.q[i * kb..(i + 1) * kb];
        for (j, o) in row.iter_mut().enumerate() {
            let blocks: Vec<P::Block> = panel_row(w, kb, j).collect();
            *o = P::dot_ref(&blocks, a);
        }
    }
}

/// Quantised activation rows for a panel kernel, with their blocks' `d` and `s` as f32
/// (row-major, `kb` per row).
pub(crate) struct PanelActs<A> {
    pub(crate) q: Vec<A>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) kb: usize,
}

/// Every weight row (of `w`, `k / 32` blocks each) dotted with every row of `x` (`m × k`,
/// quantised once) into `out` (`m × n_out`). One row (decode): the weight rows are split across
/// rayon's pool, one dot product each. A few rows (a batched decode): still split by weight rows,
/// in tiles of 2 weight rows × 4 activation rows, and gathered back. Many rows (prefill): the
/// activation rows are split instead, each task writing its own output rows while each pair of
/// weight rows, read once per task, stays in L1 for all of the task's rows.
pub(crate) fn rows_times<F: Format>(
    isa: Isa,
    w: &[F],
    x: &[f32],
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    let kb = k / F::Act::ACT_QK;
    let n_out = w.len() / kb;
    let q = quantize_rows::<F::Act>(isa, x, m, k);
    if m == 1 {
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first = task * ROWS_PER_TASK;
                F::dots(isa, &w[first * kb..(first + chunk.len()) * kb], &q, chunk);
            });
        return;
    }
    let t = f16_table();
    let stride = m.div_ceil(TILE_A) * TILE_A;
    let mut d = vec![0f32; m * kb];
    let mut s = vec![0f32; stride * kb];
    for (n, a) in q.iter().enumerate() {
        let (i, b) = (n / kb, n % kb);
        (d[n], s[b * stride + i]) = a.scales(t);
    }
    let acts = Acts {
        q,
        d,
        s,
        stride,
        kb,
    };
    if m >= 2 * ACT_ROWS_PER_TASK {
        out.par_chunks_mut(ACT_ROWS_PER_TASK * n_out)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first = task * ACT_ROWS_PER_TASK;
                let rows = chunk.len() / n_out;
                F::rows(isa, w, &acts, first..first + rows, chunk, 1, n_out);
            });
        return;
    }
    // Transposed result (`n_out × m`): each task owns whole weight rows.
    let mut out_t = vec![0f32; n_out * m];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * m)
        .enumerate()
        .for_each(|(task, chunk)| {
            let first = task * ROWS_PER_TASK;
            let rows = chunk.len() / m;
            F::rows(
                isa,
                &w[first * kb..(first + rows) * kb],
                &acts,
                0..m,
                chunk,
                m,
                1,
            );
        });
    for (i, row) in out.chunks_exact_mut(n_out).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = out_t[j * m + i];
        }
    }
}
