//! One weight matrix of an encoder ([`Matrix`]) and its vectors, made from a projector file's
//! tensors with their shapes checked.
//!
//! A matrix runs on our kernels ([`QLinear`]) where its format is one they take. Their rows are
//! whole blocks of 32, and an encoder's need not be (SigLIP's feed-forward is 4,304 wide, a
//! patch 3·14·14 = 588 values): a 16-bit matrix is padded with zero columns to the next 32,
//! and its input rows with zeros, which adds nothing to any product. A matrix in f32 (the
//! converter writes Gemma 3's patch and position embeddings so) is multiplied in f32 by
//! candle's CPU matmul, as ggml multiplies it.

use candle_core::{Device, Tensor};
use half::{bf16, f16};

use crate::kernels::{Isa, Made, QLinear, TensorType, Weights};
use candle_core::quantized::GgmlDType;

/// Rows from which an F16 matrix's product is one blocked f32 product ([`Matrix::blocked`]):
/// an encoder's hundreds to thousands of patch rows, where the kernels' eight-lane dot products
/// (which give a language model's decode steps bit-exact sums) run at a fraction of the
/// machine's multiply rate.
const GEMM_ROWS: usize = 64;

/// `dst = scale · lhs · rhs` for `(m, n, k)`: `dst` row-major (`m` rows `row` apart), `lhs` and
/// `rhs` each `(start, column stride, row stride)`, as a blocked f32 product on the pool (the
/// `gemm` crate, candle's CPU matmul).
///
/// # Safety
/// Every element the shapes and strides reach lies inside its allocation, and `dst` is not
/// read or written by anyone else meanwhile.
pub(crate) unsafe fn blocked_product(
    (m, n, k): (usize, usize, usize),
    (dst, row): (*mut f32, isize),
    (lhs, lhs_cs, lhs_rs): (*const f32, isize, isize),
    (rhs, rhs_cs, rhs_rs): (*const f32, isize, isize),
    scale: f32,
) {
    let threads = gemm::Parallelism::Rayon(rayon::current_num_threads());
    gemm::gemm(
        m, n, k, dst, 1, row, false, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs, 0.0, scale, false,
        false, false, threads,
    );
}

/// A weight matrix `[n_out, k]` (GGUF's row-major layout): `x · wᵀ` for rows `x` of `k`.
pub(crate) struct Matrix {
    n_out: usize,
    k: usize,
    kind: Kind,
}

enum Kind {
    /// On our kernels, its rows `k_pad` wide (`k` rounded up to whole blocks).
    Kernel { w: QLinear, k_pad: usize },
    /// In f32, as `[k, n_out]` (transposed once, so a product is one plain matmul).
    Exact(Tensor),
}

impl Matrix {
    /// The matrix of `values` (`n_out` rows of `k`, f32) stored in `dtype`'s precision where
    /// that is 16-bit (exact: the values came from such a file) and in f32 otherwise.
    pub(crate) fn from_f32(
        values: Vec<f32>,
        n_out: usize,
        k: usize,
        dtype: TensorType,
        isa: Isa,
    ) -> candle_core::Result<Matrix> {
        if values.len() != n_out * k {
            candle_core::bail!("{} values for a {n_out} × {k} matrix", values.len());
        }
        let half = match dtype {
            TensorType::Ggml(GgmlDType::F16) => Some(GgmlDType::F16),
            TensorType::Ggml(GgmlDType::BF16) => Some(GgmlDType::BF16),
            _ => None,
        };
        if let Some(half) = half {
            let k_pad = k.next_multiple_of(32);
            let mut bytes = Vec::with_capacity(n_out * k_pad * 2);
            for row in values.chunks_exact(k) {
                for v in row
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0.0, k_pad - k))
                {
                    let b = match half {
                        GgmlDType::F16 => f16::from_f32(v).to_le_bytes(),
                        _ => bf16::from_f32(v).to_le_bytes(),
                    };
                    bytes.extend_from_slice(&b);
                }
            }
            if let Some(w) = QLinear::from_raw(TensorType::Ggml(half), &[n_out, k_pad], &bytes, isa)
            {
                return Ok(Matrix {
                    n_out,
                    k,
                    kind: Kind::Kernel { w, k_pad },
                });
            }
        }
        let w = Tensor::from_vec(values, (n_out, k), &Device::Cpu)?
            .t()?
            .contiguous()?;
        Ok(Matrix {
            n_out,
            k,
            kind: Kind::Exact(w),
        })
    }

    /// The matrix from a file's bytes in `dtype`: a quantised one whose rows are whole blocks
    /// straight onto our kernels, any other through its f32 values.
    pub(crate) fn from_file(
        dtype: TensorType,
        n_out: usize,
        k: usize,
        bytes: &[u8],
        values: impl FnOnce() -> candle_core::Result<Vec<f32>>,
        isa: Isa,
    ) -> candle_core::Result<Matrix> {
        let quantised = !matches!(
            dtype,
            TensorType::Ggml(GgmlDType::F16 | GgmlDType::BF16 | GgmlDType::F32)
        );
        if quantised {
            if let Some(w) = QLinear::from_raw(dtype, &[n_out, k], bytes, isa) {
                return Ok(Matrix {
                    n_out,
                    k,
                    kind: Kind::Kernel { w, k_pad: k },
                });
            }
        }
        Self::from_f32(values()?, n_out, k, dtype, isa)
    }

    /// `x · wᵀ` for the `m` rows of `x` (`m × k`, row-major): `m × n_out`.
    pub(crate) fn product(&self, x: &[f32], m: usize) -> candle_core::Result<Vec<f32>> {
        if x.len() != m * self.k {
            candle_core::bail!("{} inputs for {m} rows of {}", x.len(), self.k);
        }
        if let Kind::Kernel { w, k_pad } = &self.kind {
            if m >= GEMM_ROWS {
                if let Weights::Made(Made::F16(h)) = &w.weights {
                    return Ok(self.blocked(h, *k_pad, x, m));
                }
            }
        }
        match &self.kind {
            Kind::Kernel { w, k_pad } if *k_pad == self.k => Ok(w.product(x, m)),
            Kind::Kernel { w, k_pad } => {
                let mut padded = vec![0f32; m * k_pad];
                for (out, row) in padded.chunks_exact_mut(*k_pad).zip(x.chunks_exact(self.k)) {
                    out[..self.k].copy_from_slice(row);
                }
                Ok(w.product(&padded, m))
            }
            Kind::Exact(w) => {
                let x = Tensor::from_slice(x, (m, self.k), &Device::Cpu)?;
                x.matmul(w)?.flatten_all()?.to_vec1::<f32>()
            }
        }
    }

    /// `x · wᵀ` for many rows of `x` as one blocked f32 product (the `gemm` crate, candle's CPU
    /// matmul), the 16-bit weights `h` (`n_out` rows of `k_pad`) widened to f32 for it (16 MB
    /// for a 4,096 × 1,024 matrix, for the product's time).
    fn blocked(&self, h: &[f16], k_pad: usize, x: &[f32], m: usize) -> Vec<f32> {
        use half::slice::HalfFloatSliceExt;
        let (n_out, k) = (self.n_out, self.k);
        let mut out = vec![0f32; m * n_out];
        let mut wide = vec![0f32; n_out * k_pad];
        h[..n_out * k_pad].convert_to_f32_slice(&mut wide);
        // SAFETY: the product reads `m` rows of `k` from `x` (`m × k`), `n_out` weight rows of
        // `k` from `wide` (`n_out × k_pad`, `k ≤ k_pad`), and writes the `m × n_out` of `out`.
        unsafe {
            blocked_product(
                (m, n_out, k),
                (out.as_mut_ptr(), n_out as isize),
                (x.as_ptr(), 1, k as isize),
                (wide.as_ptr(), k_pad as isize, 1),
                1.0,
            );
        }
        out
    }

    /// [`product`](Self::product) plus `bias` on every row.
    pub(crate) fn affine(
        &self,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
    ) -> candle_core::Result<Vec<f32>> {
        let mut out = self.product(x, m)?;
        if let Some(b) = bias {
            for row in out.chunks_exact_mut(self.n_out) {
                for (o, b) in row.iter_mut().zip(b) {
                    *o += b;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 16-bit matrix whose rows are not whole blocks gives the plain f32 product of its
    /// values (padded on our kernels), as an f32 one does in candle; for many rows too (one
    /// blocked product).
    #[test]
    fn a_matrix_of_any_width_gives_the_plain_product() {
        for m in [3, GEMM_ROWS + 6] {
            plain_product(m);
        }
    }

    fn plain_product(m: usize) {
        let (n_out, k) = (5, 37);
        let w: Vec<f32> = (0..n_out * k)
            .map(|i| f16::from_f32(((i * 7919) % 23) as f32 / 8.0 - 1.3).to_f32())
            .collect();
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 31) % 11) as f32 / 4.0 - 1.0)
            .collect();
        let mut expect = vec![0f32; m * n_out];
        for r in 0..m {
            for j in 0..n_out {
                expect[r * n_out + j] = (0..k).map(|i| x[r * k + i] * w[j * k + i]).sum();
            }
        }
        let isa = Isa::detect();
        for dtype in [GgmlDType::F16, GgmlDType::F32] {
            let mat = Matrix::from_f32(w.clone(), n_out, k, TensorType::Ggml(dtype), isa).unwrap();
            let got = mat.product(&x, m).unwrap();
            for (g, e) in got.iter().zip(&expect) {
                // Our f16 kernel's sums run in another order; candle's are f32 too.
                assert!(
                    (g - e).abs() <= 1e-3 * e.abs().max(1.0),
                    "{dtype:?}: {g} vs {e}"
                );
            }
        }
        let mat = Matrix::from_f32(w, n_out, k, TensorType::Ggml(GgmlDType::F16), isa).unwrap();
        assert!(matches!(mat.kind, Kind::Kernel { k_pad: 64, .. }));
        assert!(mat.product(&x[1..], m).is_err());
    }
}
