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

use crate::kernels::{Isa, QLinear, TensorType};
use candle_core::quantized::GgmlDType;

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
    /// values (padded on our kernels), as an f32 one does in candle.
    #[test]
    fn a_matrix_of_any_width_gives_the_plain_product() {
        let (n_out, k, m) = (5, 37, 3);
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
