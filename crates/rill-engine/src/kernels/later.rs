//! Panels made later. A dense matrix in a K-quant format (Q4_K, Q5_K, Q6_K: what Q4_K_M,
//! Q5_K_M and Q6_K files hold) is loaded as it lies in the memory-mapped file, read by the row
//! kernels that run a mixture's experts (`krows.rs`), so loading copies nothing and the first
//! token comes at once. Its panels (`kpanels.rs`: the same bits, much faster for a prompt's
//! many rows) are made when the engine is idle, one matrix at a time
//! (`Decoder::make_next_panels`), or by the first product of many rows (a long prompt's
//! chunk), whichever comes first.
//! Then the matrix's pages leave the process's map (they stay in the page cache), so the
//! memory held is about the file's size throughout, not the file plus its repacked copy.
//!
//! A row's output is the scalar reference's bits on either layout (the kernels' promise), so an
//! answer that runs on the rows, then on the panels, is the answer it would have been.

use std::sync::OnceLock;

use super::*;

/// Rows of a product from which the panels are made first, if they are not yet: a long
/// prompt's chunk, which they repay. Fewer (a decode step, a draft's check, a short question)
/// run on the file's rows meanwhile: a decode step at the same speed per byte, a few prompt
/// rows slower than on panels but far sooner than after making them (a 25-token question to
/// an 8B model right after loading: see docs/kernels.md).
pub(crate) const PANELS_NOW_ROWS: usize = 64;

/// Whether a dense matrix of this format and shape is read in the map at load and its panels
/// made later: the K-quants, where loading would make panels of them (their row kernels and
/// their panels both give the scalar reference's exact bits, so a row's output does not depend
/// on which runs it; Q4_0's and Q8_0's SIMD rows sum their blocks in another order than their
/// panels, so they are made at load). `RILL_PANELS_AT_LOAD=1` makes every panel at load.
pub(crate) fn panels_later(dtype: TensorType, n_out: usize, k: usize, isa: Isa) -> bool {
    // Read once: a model has hundreds of matrices.
    static AT_LOAD: OnceLock<bool> = OnceLock::new();
    if *AT_LOAD.get_or_init(|| std::env::var_os("RILL_PANELS_AT_LOAD").is_some_and(|v| v != "0")) {
        return false;
    }
    let wide = isa == Isa::Avx512Vnni && n_out.is_multiple_of(16);
    let eights = isa.avx2() && n_out.is_multiple_of(8);
    let k_quant = matches!(
        dtype,
        TensorType::Ggml(GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K)
    );
    k_quant && (wide || eights) && k.is_multiple_of(QK_K)
}

/// A matrix read in the map until its panels are made.
pub(crate) struct Later {
    pub(crate) rows: FileRows,
    n_out: usize,
    k: usize,
    isa: Isa,
    /// The panels, once made (`None` if making them failed: the rows serve on).
    made: OnceLock<Option<Made>>,
}

impl Later {
    pub(crate) fn new(rows: FileRows, n_out: usize, k: usize, isa: Isa) -> Later {
        Later {
            rows,
            n_out,
            k,
            isa,
            made: OnceLock::new(),
        }
    }

    /// The panels, when made.
    pub(crate) fn ready(&self) -> Option<&Made> {
        self.made.get().and_then(Option::as_ref)
    }

    /// Whether the panels are still to be made.
    pub(crate) fn pending(&self) -> bool {
        self.made.get().is_none()
    }

    /// The panels, made now if they are not yet (a second caller waits for the first), then
    /// the rows' pages released from the map.
    pub(crate) fn make(&self) -> Option<&Made> {
        self.made
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let made = self.rows.panels(self.k, self.isa);
                tracing::trace!(
                    rows = self.n_out,
                    k = self.k,
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "panels made"
                );
                made
            })
            .as_ref()
    }

    /// The layout a product of `m` rows runs on: the panels where made (or due now), else
    /// `None`, the file's rows.
    pub(crate) fn for_rows(&self, m: usize) -> Option<&Made> {
        match m >= PANELS_NOW_ROWS {
            true => self.make(),
            false => self.ready(),
        }
    }

    /// `more`'s rows after these (stacking parts at load, before anything was made).
    pub(crate) fn extend(&mut self, more: Later) -> Option<()> {
        if self.made.get().is_some() || more.made.get().is_some() || self.k != more.k {
            return None;
        }
        self.rows.extend(more.rows)?;
        self.n_out += more.n_out;
        Some(())
    }
}

/// Rows made into panels at a time: a band's pages leave the map once its panels are made, so
/// a matrix is never held twice (a 3B model's output matrix is 15% of its file).
const BAND_ROWS: usize = 512;

impl FileRows {
    /// The panels these rows make, as loading makes them from the file's bytes (sixteen rows
    /// with AVX-512, eight with AVX2, where every stretch's rows allow it); `None` where they
    /// make none.
    fn panels(&self, k: usize, isa: Isa) -> Option<Made> {
        let (wide, eights) = (isa == Isa::Avx512Vnni, isa.avx2());
        // Sixteen rows where the instruction set and the rows allow, else eight.
        macro_rules! either {
            ($r:expr, $x16:ident, $x8:ident) => {
                wide.then(|| banded($r, k).map(Made::$x16))
                    .flatten()
                    .or_else(|| eights.then(|| banded($r, k).map(Made::$x8)).flatten())
            };
        }
        match self {
            FileRows::Q4K(r) => either!(r, Q4Kx16, Q4Kx8),
            FileRows::Q5K(r) => either!(r, Q5Kx16, Q5Kx8),
            FileRows::Q6K(r) => either!(r, Q6Kx16, Q6Kx8),
            _ => None,
        }
    }
}

/// Rows of `k` weights (super-blocks of 256) as panels of `P`, made [`BAND_ROWS`] at a time
/// straight into the one buffer they end in, each band's pages dropped from the map once
/// made; `None` unless every stretch is whole panels.
fn banded<P: Panel>(rows: &Rows<P::Block>, k: usize) -> Option<Vec<P>>
where
    P::Block: PlainBlock,
{
    let kb = k / QK_K;
    let stretches = rows.stretch_blocks();
    if kb == 0
        || stretches
            .iter()
            .any(|s| !(s.len() / kb).is_multiple_of(P::ROWS))
    {
        return None;
    }
    let mut out = Vec::with_capacity(rows.n_blocks() / P::ROWS);
    for stretch in stretches {
        for band in stretch.chunks(BAND_ROWS * kb) {
            extend_panels(&mut out, band, kb);
            rows.release(band);
        }
    }
    Some(out)
}
