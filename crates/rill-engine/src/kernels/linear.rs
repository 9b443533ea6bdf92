//! [`QLinear`]: a quantised matrix in the layout our kernels read, made from a GGUF tensor, and
//! its products with activation rows.

use super::*;

/// A quantised weight matrix `[n_out, k]` (GGUF's row-major layout) that our kernels run.
pub struct QLinear {
    pub(crate) weights: Weights,
    pub(crate) n_out: usize,
    pub(crate) k: usize,
    pub(crate) isa: Isa,
    /// Bytes the matrix takes in the file, before any repacking.
    pub(crate) file_bytes: usize,
}

/// A 16-bit float row into `out` (`k` values).
fn half_row<H: Half>(w: &[H], out: &mut [f32]) {
    for (o, w) in out.iter_mut().zip(w) {
        *o = w.to_f32();
    }
}

/// Weight rows per task: enough work per task to amortise rayon's hand-off, enough tasks to
/// balance the threads.
pub(crate) const ROWS_PER_TASK: usize = 64;

/// Rows of a Q6_K matrix dequantised at a time on their way to Q8_0: 64 rows of 4,096
/// weights are 1 MB of f32, where the whole output matrix of an 8B model would be 2 GB.
const Q6_K_BAND: usize = 64;

/// Q6_K's `n_out` rows of `k` weights (`bytes` as the file stores them) dequantised and
/// quantised again as Q8_0 (see the module's notes), a band of rows at a time, so the matrix
/// never exists in f32 whole. Each block's arithmetic is the whole matrix's, so the result is
/// the same bits.
fn q6_k_as_q8_0(bytes: &[u8], n_out: usize, k: usize) -> Option<Vec<BlockQ8_0>> {
    let row_bytes = bytes.len() / n_out.max(1);
    let mut w = Vec::with_capacity(n_out * k / QK);
    for first in (0..n_out).step_by(Q6_K_BAND) {
        let rows = Q6_K_BAND.min(n_out - first);
        let band = &bytes[first * row_bytes..(first + rows) * row_bytes];
        let band = candle_core::quantized::ggml_file::qtensor_from_ggml(
            GgmlDType::Q6K,
            band,
            vec![rows, k],
            &Device::Cpu,
        )
        .ok()?;
        let x = band.dequantize(&Device::Cpu).ok()?.flatten_all().ok()?;
        let x = x.to_vec1::<f32>().ok()?;
        let at = w.len();
        w.resize(at + x.len() / QK, BlockQ8_0::default());
        quantize_q8_0(&x, &mut w[at..]);
    }
    Some(w)
}

impl QLinear {
    /// The matrix, when its format is one the kernels run and its rows are whole blocks of 32;
    /// `None` leaves it to candle.
    pub fn from_qtensor(t: &QTensor, isa: Isa) -> Option<QLinear> {
        Self::from_raw(t.dtype().into(), t.shape().dims(), &t.data().ok()?, isa)
    }

    /// [`from_qtensor`](Self::from_qtensor) from a tensor's format, shape (`[n_out, k]`) and
    /// bytes as the file holds them (a model's weights come straight from a map of the file).
    pub fn from_raw(dtype: TensorType, dims: &[usize], bytes: &[u8], isa: Isa) -> Option<QLinear> {
        Self::from_raw_in(dtype, dims, bytes, isa, None, false)
    }

    /// [`from_raw`](Self::from_raw), where `bytes` lie at `.1` in the map `.0`: a format that
    /// runs as the file holds it is read there and not copied (`mapped.rs`): MXFP4 always, and
    /// with `rows_in_map` (a mixture's experts) Q8_0 everywhere and Q4_0 and the K-quants where
    /// their row kernels have SIMD (elsewhere they are repacked as without a map), and Q4_0
    /// whose rows are not in eights (no panels) where those kernels have SIMD; without it, a
    /// K-quant matrix is read there until its panels are made (`later.rs`).
    pub(crate) fn from_raw_in(
        dtype: TensorType,
        dims: &[usize],
        bytes: &[u8],
        isa: Isa,
        map: Option<(&std::sync::Arc<memmap2::Mmap>, usize)>,
        rows_in_map: bool,
    ) -> Option<QLinear> {
        if !Self::supports_raw(dtype, dims) {
            return None;
        }
        let isa = isa.checked();
        let &[n_out, k] = dims else {
            return None;
        };
        let matrix = |weights| QLinear {
            weights,
            n_out,
            k,
            isa,
            file_bytes: bytes.len(),
        };
        let in_map = match dtype {
            TensorType::Mxfp4 => true,
            TensorType::Ggml(GgmlDType::Q8_0) => rows_in_map && map.is_some(),
            // Q4_0 rows not in eights (no panels) too: read there, it runs as the file holds it
            // (ggml's arithmetic) rather than as Q4_1.
            TensorType::Ggml(GgmlDType::Q4_0) => {
                (rows_in_map || n_out % 8 != 0) && map.is_some() && isa.avx2()
            }
            TensorType::Ggml(GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K) => {
                rows_in_map && map.is_some() && isa.avx2() && k % QK_K == 0
            }
            _ => false,
        };
        if !in_map && map.is_some() && panels_later(dtype, n_out, k, isa) {
            // Read in the map now, its panels made later (`later.rs`), where it lies there.
            if let Some(rows) = FileRows::new(dtype, bytes, map) {
                if rows.mapped_bytes() == bytes.len() && rows.n_blocks() == n_out * (k / QK) {
                    let later = std::sync::Arc::new(Later::new(rows, n_out, k, isa));
                    return Some(matrix(Weights::Later(later)));
                }
            }
        }
        if in_map {
            let weights = Weights::File(FileRows::new(dtype, bytes, map)?);
            return (weights.n_blocks() == n_out * (k / QK)).then(|| matrix(weights));
        }
        let TensorType::Ggml(dtype) = dtype else {
            return None;
        };
        // K-quant rows are whole super-blocks of 256 (a file that says otherwise is not ours).
        let k_quant = matches!(dtype, GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K);
        if k_quant && k % (8 * QK) != 0 {
            return None;
        }
        // Panels where the rows allow them: sixteen rows with AVX-512, else eight with AVX2 for
        // the 4-bit formats and with AVX-VNNI for Q8_0 (without, its byte products would
        // overflow the 256-bit panel kernel's i16).
        let (kb, wide) = (k / QK, isa == Isa::Avx512Vnni && n_out % 16 == 0);
        let eights = isa.avx2() && n_out % 8 == 0;
        let vnni_eights = isa.avx_vnni() && n_out % 8 == 0;
        let weights = match dtype {
            // Q4_0 and the K-quants in panels as the file holds them; elsewhere as Q4_1 or Q8_0
            // (Q5_K: left to candle).
            GgmlDType::Q4_0 if wide => Made::Q4_0x16(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q4_0 if eights => Made::Q4_0x8(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q4K if wide => Made::Q4Kx16(to_panels(&block_slice(bytes)?, kb / 8)),
            GgmlDType::Q4K if eights => Made::Q4Kx8(to_panels(&block_slice(bytes)?, kb / 8)),
            GgmlDType::Q5K if wide => Made::Q5Kx16(to_panels(&block_slice(bytes)?, kb / 8)),
            GgmlDType::Q5K if eights => Made::Q5Kx8(to_panels(&block_slice(bytes)?, kb / 8)),
            GgmlDType::Q6K if wide => Made::Q6Kx16(to_panels(&block_slice(bytes)?, kb / 8)),
            GgmlDType::Q6K if eights => Made::Q6Kx8(to_panels(&block_slice(bytes)?, kb / 8)),
            // Q8_0 and Q4_1 panels straight from the file's blocks too: a copy of the blocks
            // first wrote each matrix twice (the 1B shape's 1.3 GB Q8_0 file loaded in 1.6–2.7
            // s, now in 1.1–1.2).
            GgmlDType::Q8_0 if wide => Made::Q8_0x16(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q8_0 if vnni_eights => Made::Q8_0x8(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q4_1 if wide => Made::Q4_1x16(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q4_1 if eights => Made::Q4_1x8(to_panels(&block_slice(bytes)?, kb)),
            GgmlDType::Q4_1 => Made::Q4_1(blocks(bytes)?),
            GgmlDType::Q8_0 => Made::Q8_0(blocks(bytes)?),
            GgmlDType::Q4_0 => Made::Q4_1(q4_0_as_q4_1(&blocks(bytes)?)),
            GgmlDType::Q5_0 => Made::Q8_0(q5_0_as_q8_0(&blocks(bytes)?)),
            GgmlDType::Q4K => Made::Q4_1(q4_k_as_q4_1(&blocks(bytes)?)),
            GgmlDType::Q6K => Made::Q8_0(q6_k_as_q8_0(bytes, n_out, k)?),
            GgmlDType::F16 => Made::F16(blocks(bytes)?),
            GgmlDType::BF16 => Made::Bf16(blocks(bytes)?),
            _ => return None,
        };
        if weights.n_blocks() != n_out * kb {
            return None;
        }
        let weights = match weights {
            Made::Q4_1(w) if wide => Made::Q4_1x16(to_panels(&w, kb)),
            Made::Q4_1(w) if eights => Made::Q4_1x8(to_panels(&w, kb)),
            Made::Q8_0(w) if wide => Made::Q8_0x16(to_panels(&w, kb)),
            Made::Q8_0(w) if vnni_eights => Made::Q8_0x8(to_panels(&w, kb)),
            w => w,
        };
        Some(matrix(Weights::Made(weights)))
    }

    /// Whether [`from_qtensor`](Self::from_qtensor) takes this tensor (without copying it).
    pub fn supports(t: &QTensor) -> bool {
        Self::supports_raw(t.dtype().into(), t.shape().dims())
    }

    /// [`supports`](Self::supports) by format and shape.
    pub fn supports_raw(dtype: TensorType, dims: &[usize]) -> bool {
        matches!(dims, &[_, k] if k > 0 && k % QK == 0)
            && matches!(
                dtype,
                TensorType::Mxfp4
                    | TensorType::Ggml(
                        GgmlDType::Q4_1
                            | GgmlDType::Q8_0
                            | GgmlDType::Q4_0
                            | GgmlDType::Q5_0
                            | GgmlDType::Q4K
                            | GgmlDType::Q5K
                            | GgmlDType::Q6K
                            | GgmlDType::F16
                            | GgmlDType::BF16
                    )
            )
    }

    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// Bytes the matrix takes in the file it came from.
    pub fn file_bytes(&self) -> usize {
        self.file_bytes
    }

    /// Bytes of weights that lie in the memory-mapped file, not in memory of our own.
    pub fn mapped_bytes(&self) -> usize {
        match self.weights.held() {
            Held::Rows(rows) => rows.mapped_bytes(),
            Held::Made(_) => 0,
        }
    }

    /// Bytes of weights held: what one product reads.
    pub fn bytes(&self) -> usize {
        match self.weights.held() {
            Held::Rows(rows) => rows.bytes(),
            Held::Made(w) => each_layout!(w, w => std::mem::size_of_val(w.as_slice())),
        }
    }

    /// The matrix whose panels are still to be made, shared with whoever makes them
    /// (`later.rs`).
    pub(crate) fn later(&self) -> Option<std::sync::Arc<Later>> {
        match &self.weights {
            Weights::Later(l) if l.pending() => Some(l.clone()),
            _ => None,
        }
    }

    /// Row `j` as f32 into `out` (`k` values): an embedding lookup straight from the quantised
    /// table, so the table never has to exist in f32 (113 MB for a 49,152 × 576 vocabulary).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        let weights = match self.weights.held() {
            Held::Rows(rows) => return rows.dequantize_row(j, self.k, out),
            Held::Made(w) => w,
        };
        let kb = self.k / QK;
        let row = j * kb..(j + 1) * kb;
        let (q4_1, q4_0, q4_k, q5_k, q6_k, q8_0) = (
            dequantize_q4_1 as fn(&[f32], &BlockQ4_1, &mut [f32]),
            dequantize_q4_0 as fn(&[f32], &BlockQ4_0, &mut [f32]),
            dequantize_q4_k as fn(&[f32], &BlockQ4K, &mut [f32]),
            dequantize_q5_k as fn(&[f32], &BlockQ5K, &mut [f32]),
            dequantize_q6_k as fn(&[f32], &BlockQ6K, &mut [f32]),
            dequantize_q8_0 as fn(&[f32], &BlockQ8_0, &mut [f32]),
        );
        match weights {
            Made::Q4_1(w) => dequantize_blocks(w[row].iter().copied(), out, QK, q4_1),
            Made::Q4_1x8(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q4_1),
            Made::Q4_1x16(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q4_1),
            Made::Q4_0x8(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q4_0),
            Made::Q4_0x16(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q4_0),
            Made::Q4Kx8(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q4_k),
            Made::Q4Kx16(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q4_k),
            Made::Q5Kx8(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q5_k),
            Made::Q5Kx16(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q5_k),
            Made::Q6Kx8(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q6_k),
            Made::Q6Kx16(w) => dequantize_blocks(panel_row(w, kb / 8, j), out, 8 * QK, q6_k),
            Made::Q8_0(w) => dequantize_blocks(w[row].iter().copied(), out, QK, q8_0),
            Made::Q8_0x8(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q8_0),
            Made::Q8_0x16(w) => dequantize_blocks(panel_row(w, kb, j), out, QK, q8_0),
            Made::F16(w) => half_row(&w[j * self.k..(j + 1) * self.k], out),
            Made::Bf16(w) => half_row(&w[j * self.k..(j + 1) * self.k], out),
        }
    }

    /// The rows `ids` as a `[ids.len(), k]` tensor; `None` when an id is out of range.
    pub fn rows(&self, ids: &[u32]) -> Option<candle_core::Result<Tensor>> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (&id, o) in ids.iter().zip(out.chunks_exact_mut(self.k)) {
            if id as usize >= self.n_out {
                return None;
            }
            self.dequantize_row(id as usize, o);
        }
        Some(Tensor::from_vec(out, (ids.len(), self.k), &Device::Cpu))
    }

    /// `out[i][j] = Σ_k x[i][k]·w[j][k]` for the `m` rows of `x` (`m × k`, row-major);
    /// `out` is `m × n_out`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.k);
        assert_eq!(out.len(), m * self.n_out);
        match &self.weights {
            Weights::Made(w) => self.matmul_made(w, x, m, out),
            Weights::File(w) => w.matmul(self.isa, x, m, self.k, out),
            Weights::Later(l) => match l.for_rows(m) {
                Some(w) => self.matmul_made(w, x, m, out),
                None => l.rows.matmul(self.isa, x, m, self.k, out),
            },
        }
    }

    fn matmul_made(&self, weights: &Made, x: &[f32], m: usize, out: &mut [f32]) {
        match weights {
            Made::Q4_1(w) => rows_times(self.isa, w, x, m, self.k, out),
            Made::Q8_0(w) => rows_times(self.isa, w, x, m, self.k, out),
            Made::Q4_1x8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q4_1x16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q4_0x8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q4_0x16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q4Kx8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q4Kx16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q5Kx8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q5Kx16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q6Kx8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q6Kx16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q8_0x8(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::Q8_0x16(w) => panels_times(self.isa, w, x, m, self.k, out),
            Made::F16(w) => half_times(self.isa, w, x, m, self.k, out),
            Made::Bf16(w) => half_times(self.isa, w, x, m, self.k, out),
        }
    }

    /// `x · wᵀ` for a `[m, k]` tensor of f32 on the CPU.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (m, out) = self.run(x)?;
        Tensor::from_vec(out, (m, self.n_out), &Device::Cpu)
    }

    /// The product of a `[m, k]` tensor as `m` and a row-major `m × n_out` buffer.
    pub(crate) fn run(&self, x: &Tensor) -> candle_core::Result<(usize, Vec<f32>)> {
        let (m, k) = x.dims2()?;
        if k != self.k {
            candle_core::bail!("QLinear: input has {k} columns, the weights {}", self.k);
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        Ok((m, self.product(&xs, m)))
    }

    /// [`matmul`](Self::matmul) into a new `m × n_out` buffer.
    pub fn product(&self, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * self.n_out];
        self.matmul(x, m, &mut out);
        out
    }

    /// Whether [`stack`](Self::stack) takes these: the same input width, instruction set,
    /// format and layout.
    pub fn stackable(parts: &[QLinear]) -> bool {
        use std::mem::discriminant;
        // The layout, and for rows read as the file holds them, their format.
        let layout = |w: &Weights| {
            let (made, rows) = match w {
                Weights::Made(m) => (Some(discriminant(m)), None),
                Weights::File(r) => (None, Some(discriminant(r))),
                Weights::Later(l) => (None, Some(discriminant(&l.rows))),
            };
            (discriminant(w), made, rows)
        };
        parts.windows(2).all(|w| {
            (w[0].k, w[0].isa) == (w[1].k, w[1].isa)
                && layout(&w[0].weights) == layout(&w[1].weights)
        })
    }

    /// Stacks matrices that read the same input (q, k and v; gate and up) into one, so one call
    /// quantises the input once and hands the threads one job. `None` unless all share the
    /// format, the input width and the instruction set.
    pub fn stack(parts: Vec<QLinear>) -> Option<QLinear> {
        let first = parts.first()?;
        let (k, isa) = (first.k, first.isa);
        if parts.iter().any(|p| p.k != k || p.isa != isa) {
            return None;
        }
        let n_out = parts.iter().map(|p| p.n_out).sum();
        let file_bytes = parts.iter().map(|p| p.file_bytes).sum();
        let mut all = parts.into_iter();
        let mut weights = all.next()?.weights;
        for p in all {
            weights.extend(p.weights)?;
        }
        Some(QLinear {
            weights,
            n_out,
            k,
            isa,
            file_bytes,
        })
    }

    /// [`forward`](Self::forward) of a stacked matrix, cut back into its parts' outputs
    /// (`widths`, which add up to `n_out`).
    pub fn forward_parts(&self, x: &Tensor, widths: &[usize]) -> candle_core::Result<Vec<Tensor>> {
        // Cut from the product buffer itself, not from a tensor made of it and read back.
        let (m, whole) = self.run(x)?;
        let mut from = 0;
        widths
            .iter()
            .map(|&w| {
                let part: Vec<f32> = whole
                    .chunks_exact(self.n_out)
                    .flat_map(|row| &row[from..from + w])
                    .copied()
                    .collect();
                from += w;
                Tensor::from_vec(part, (m, w), &Device::Cpu)
            })
            .collect()
    }
}

#[cfg(test)]
mod q6_k_tests {
    use super::*;
    use crate::kernels::tests::Lcg;

    /// Band by band (100 rows: one band of 64 and a short one), the Q6_K → Q8_0 repacking
    /// gives the bits of the whole matrix dequantised and quantised at once.
    #[test]
    fn q6_k_repacks_band_by_band_to_the_whole_matrix_bits() {
        let (n, k) = (100, 512);
        let x = Tensor::from_vec(Lcg(3).vec(n * k), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&x, GgmlDType::Q6K).unwrap();
        let whole = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
        let whole = whole.to_vec1::<f32>().unwrap();
        let mut want = vec![BlockQ8_0::default(); n * k / QK];
        quantize_q8_0(&whole, &mut want);
        let banded = q6_k_as_q8_0(&q.data().unwrap(), n, k).unwrap();
        assert!(banded == want);
    }
}
