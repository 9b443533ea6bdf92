//! The formats that run as the file holds them, in panels (Q4_0, Q4_K, Q5_K and Q6_K): their
//! layout gives back the file's blocks, takes no more memory than the file (plus the K-quants'
//! unpacked scales), and their kernels agree with the scalar reference and with each other on
//! every instruction set this CPU has; the Q8_K quantiser; and `QLinear::reference`, the
//! scalar reference of every layout, which the kernel tests of both files use.

use super::tests::Lcg;
use super::*;

impl QLinear {
    /// Row `j` · the activation row `xs`, by the scalar reference of whatever layout holds it.
    pub(crate) fn reference(&self, j: usize, xs: &[f32]) -> f32 {
        let kb = self.k / QK;
        let (mut a1, mut a8, mut ak) = (
            vec![BlockQ8_1::default(); kb],
            vec![BlockQ8_0::default(); kb],
            vec![BlockQ8K::default(); self.k / QK_K],
        );
        quantize_q8_1(xs, &mut a1);
        quantize_q8_0(xs, &mut a8);
        quantize_q8_k(xs, &mut ak);
        fn dot<P: Panel>(w: &[P], kb: usize, j: usize, a: &[Act<P>]) -> f32 {
            P::dot_ref(&panel_row(w, kb, j).collect::<Vec<_>>(), a)
        }
        let kbk = self.k / QK_K;
        let file = |rows: &FileRows| match rows {
            FileRows::Mxfp4(w) => dot_mxfp4_q8_0_scalar(w.row(j, kb), &a8),
            FileRows::Q4_0(w) => dot_q4_0_q8_1_scalar(w.row(j, kb), &a1),
            FileRows::Q8_0(w) => dot_q8_0_q8_0_scalar(w.row(j, kb), &a8),
            FileRows::Q4K(w) => dot_q4_k_q8_k_scalar(w.row(j, kbk), &ak),
            FileRows::Q5K(w) => dot_q5_k_q8_k_scalar(w.row(j, kbk), &ak),
            FileRows::Q6K(w) => dot_q6_k_q8_k_scalar(w.row(j, kbk), &ak),
        };
        let made = match self.weights.held() {
            Held::Rows(rows) => return file(rows),
            Held::Made(m) => m,
        };
        match made {
            Made::Q4_1(w) => dot_q4_1_q8_1_scalar(&w[j * kb..(j + 1) * kb], &a1),
            Made::Q8_0(w) => dot_q8_0_q8_0_scalar(&w[j * kb..(j + 1) * kb], &a8),
            Made::Q4_1x8(w) => dot(w, kb, j, &a1),
            Made::Q4_1x16(w) => dot(w, kb, j, &a1),
            Made::Q4_0x8(w) => dot(w, kb, j, &a1),
            Made::Q4_0x16(w) => dot(w, kb, j, &a1),
            Made::Q4Kx8(w) => dot(w, kbk, j, &ak),
            Made::Q4Kx16(w) => dot(w, kbk, j, &ak),
            Made::Q5Kx8(w) => dot(w, kbk, j, &ak),
            Made::Q5Kx16(w) => dot(w, kbk, j, &ak),
            Made::Q6Kx8(w) => dot(w, kbk, j, &ak),
            Made::Q6Kx16(w) => dot(w, kbk, j, &ak),
            Made::Q8_0x8(w) => dot(w, kb, j, &a8),
            Made::Q8_0x16(w) => dot(w, kb, j, &a8),
            Made::F16(w) => dot_half_ref(&w[j * self.k..(j + 1) * self.k], xs),
            Made::Bf16(w) => dot_half_ref(&w[j * self.k..(j + 1) * self.k], xs),
        }
    }
}

fn quantized(r: &mut Lcg, n_out: usize, k: usize, dtype: GgmlDType) -> QTensor {
    let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
    QTensor::quantize(&wt, dtype).unwrap()
}

/// Whether `isa` puts a matrix of `n_out` rows in panels.
fn in_panels(isa: Isa, n_out: usize) -> bool {
    isa.avx2() && n_out.is_multiple_of(8)
}

#[test]
fn panels_give_back_the_files_blocks() {
    /// Every row of `q` in panels of type `P` (of both widths) gives back the file's blocks.
    fn check<P: Panel<Block: Default>>(q: &QTensor, k: usize, width: usize) {
        let b: Vec<P::Block> = blocks(&q.data().unwrap()).unwrap();
        let kb = k / width;
        let p: Vec<P> = to_panels(&b, kb);
        for j in 0..q.shape().dims()[0] {
            let row: Vec<_> = panel_row(&p, kb, j).collect();
            let bytes = |r: &[P::Block]| {
                // SAFETY: plain-old-data blocks (see `blocks`), read as bytes to compare.
                unsafe { std::slice::from_raw_parts(r.as_ptr() as *const u8, size_of_val(r)) }
                    .to_vec()
            };
            assert!(
                bytes(&row) == bytes(&b[j * kb..(j + 1) * kb]),
                "{:?} row {j}",
                q.dtype()
            );
        }
    }
    let mut r = Lcg(51);
    let (n_out, k) = (16, 512);
    let q = quantized(&mut r, n_out, k, GgmlDType::Q4_1);
    check::<PanelQ4_1<8>>(&q, k, QK);
    check::<PanelQ4_1<16>>(&q, k, QK);
    let q = quantized(&mut r, n_out, k, GgmlDType::Q4_0);
    check::<PanelQ4_0<8>>(&q, k, QK);
    check::<PanelQ4_0<16>>(&q, k, QK);
    let q = quantized(&mut r, n_out, k, GgmlDType::Q4K);
    check::<PanelQ4K<8>>(&q, k, QK_K);
    check::<PanelQ4K<16>>(&q, k, QK_K);
    let q = quantized(&mut r, n_out, k, GgmlDType::Q5K);
    check::<PanelQ5K<8>>(&q, k, QK_K);
    check::<PanelQ5K<16>>(&q, k, QK_K);
    let q = quantized(&mut r, n_out, k, GgmlDType::Q6K);
    check::<PanelQ6K<8>>(&q, k, QK_K);
    check::<PanelQ6K<16>>(&q, k, QK_K);
}

/// Memory is the file's: Q4_0 and Q6_K exactly, Q4_K within 3% (its unpacked sub-block
/// scales).
#[test]
fn native_panels_hold_what_the_file_holds() {
    let mut r = Lcg(53);
    for (dtype, most) in [
        (GgmlDType::Q4_0, 1.0),
        (GgmlDType::Q4K, 1.03),
        (GgmlDType::Q5K, 1.025),
        (GgmlDType::Q6K, 1.0),
    ] {
        let q = quantized(&mut r, 144, 512, dtype);
        for isa in Isa::available() {
            let Some(lin) = QLinear::from_qtensor(&q, isa) else {
                // Q5_K has no repacked form: without panels, candle runs it.
                assert!(
                    dtype == GgmlDType::Q5K && !in_panels(isa, 144),
                    "{dtype:?} {isa:?}"
                );
                continue;
            };
            let ratio = lin.bytes() as f64 / lin.file_bytes() as f64;
            if in_panels(isa, 144) {
                assert!(ratio <= most, "{dtype:?} {isa:?}: {ratio}");
            } else {
                // Without AVX2 these still run as Q4_1 or Q8_0.
                assert!(ratio > 1.0, "{dtype:?} {isa:?}: {ratio}");
            }
        }
    }
}

/// Every output of the K-quant kernels (every shape of tile, both splits of the work) against
/// the scalar reference of its pair (in panels, bit for bit), and their rows dequantised
/// exactly as candle does.
#[test]
fn k_quants_equal_the_scalar_reference() {
    let mut r = Lcg(57);
    // Three super-blocks a row; 7 rows (no panels: Q4_1 or Q8_0), 8, 136 (panels of 8), 144
    // (of 16 with AVX-512).
    let k = 768;
    for (n_out, dtype) in [7, 8, 136, 144]
        .into_iter()
        .flat_map(|n| [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K].map(|d| (n, d)))
    {
        let q = quantized(&mut r, n_out, k, dtype);
        let theirs = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for m in [1, 2, 3, 4, 5, 9, 70] {
            let x: Vec<f32> = r.vec(m * k).iter().map(|v| v * 2.0).collect();
            for isa in Isa::available() {
                let Some(lin) = QLinear::from_qtensor(&q, isa) else {
                    assert!(dtype == GgmlDType::Q5K && !in_panels(isa, n_out));
                    continue;
                };
                let mut out = vec![0f32; m * n_out];
                lin.matmul(&x, m, &mut out);
                for (i, row) in out.chunks_exact(n_out).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        let want = lin.reference(j, &x[i * k..(i + 1) * k]);
                        // In panels, the kernels' integers and fused multiply-adds are the
                        // reference's, so the bits are too.
                        let exact = in_panels(isa, n_out) && v.to_bits() == want.to_bits();
                        assert!(
                            exact
                                || !in_panels(isa, n_out)
                                    && (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{dtype:?} {isa:?} n_out={n_out} m={m} ({i}, {j}): {v} vs {want}"
                        );
                    }
                }
                if m == 1 && in_panels(isa, n_out) {
                    let ids: Vec<u32> = (0..n_out as u32).collect();
                    let ours = lin.rows(&ids).unwrap().unwrap().to_vec2::<f32>().unwrap();
                    assert!(
                        ours == theirs,
                        "{isa:?} n_out={n_out}: rows differ from candle's"
                    );
                }
            }
        }
    }
}

/// The K-quant panels of every instruction set give the same bits (AVX2's `maddubs`,
/// AVX-VNNI's and AVX-512's sixteen rows), and a row's output is the same alone and in a batch.
#[test]
fn k_quant_panels_agree_bit_for_bit() {
    let mut r = Lcg(59);
    let k = 512;
    for (n_out, dtype) in [8, 136, 144]
        .into_iter()
        .flat_map(|n| [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K].map(|d| (n, d)))
    {
        let q = quantized(&mut r, n_out, k, dtype);
        let lins: Vec<(Isa, QLinear)> = Isa::available()
            .into_iter()
            .filter(|&isa| in_panels(isa, n_out))
            .map(|isa| (isa, QLinear::from_qtensor(&q, isa).unwrap()))
            .collect();
        for m in [1, 3, 4, 5, 70] {
            let x = r.vec(m * k);
            let run = |l: &QLinear, x: &[f32], m: usize| {
                let mut out = vec![0f32; m * n_out];
                l.matmul(x, m, &mut out);
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let Some(((first, reference), _)) = lins.split_first() else {
                eprintln!("no panels on this CPU: skipped");
                return;
            };
            let want = run(reference, &x, m);
            for (isa, l) in &lins {
                assert!(
                    run(l, &x, m) == want,
                    "{dtype:?} n_out={n_out} m={m}: {isa:?} differs from {first:?}"
                );
                for i in [0, m - 1] {
                    let alone = run(l, &x[i * k..(i + 1) * k], 1);
                    assert!(
                        alone == want[i * n_out..(i + 1) * n_out],
                        "{dtype:?} {isa:?} m={m} row {i}"
                    );
                }
            }
        }
    }
}

/// The K-quants' activations are quantised as ggml's `quantize_row_q8_K`: the first value of
/// largest magnitude maps to −127 (its sign flips the scale), halves round to even, each 16's
/// sum is kept, and a block of zeros is all zeros.
#[test]
fn q8_k_quantises_as_ggml() {
    let mut x = vec![0f32; 2 * QK_K];
    // Block 0: −127 first, then +127 (the same magnitude): iscale = −127/−127 = 1 exactly.
    x[0] = -127.0;
    x[1] = 127.0;
    x[2] = 2.5;
    x[3] = 3.5;
    x[4] = -2.5;
    x[17] = 10.0;
    let mut out = vec![BlockQ8K::default(); 2];
    for isa in Isa::available() {
        BlockQ8K::quantize(isa.checked(), &x, &mut out);
        let b = &out[0];
        assert_eq!(b.d, 1.0, "{isa:?}");
        assert_eq!(&b.qs[..5], &[-127, 127, 2, 4, -2], "{isa:?}");
        assert_eq!((b.bsums[0], b.bsums[1], b.bsums[2]), (4, 10, 0), "{isa:?}");
        assert_eq!(b.sum32(0), 14);
        assert!(out[1] == BlockQ8K::default(), "{isa:?}");
    }
    // +3 before −3: the scale is negative, so +3 maps to −127.
    let mut y = vec![0f32; QK_K];
    (y[5], y[9], y[11]) = (3.0, -3.0, 1.0);
    quantize_q8_k(&y, &mut out[..1]);
    assert_eq!(
        (out[0].qs[5], out[0].qs[9], out[0].qs[11]),
        (-127, 127, -42)
    );
    assert_eq!(out[0].d, 1.0 / (-127.0f32 / 3.0));
}
