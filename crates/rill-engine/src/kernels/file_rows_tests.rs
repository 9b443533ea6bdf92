//! Weights read in the memory-mapped file (`mapped.rs`, `krows.rs`, `later.rs`). A mixture's
//! experts in Q4_0, Q8_0, Q4_K, Q5_K and Q6_K read where they lie give every output the scalar
//! reference's bits on every instruction set, alone and in batches, stacked from parts at
//! different offsets, and take no memory of their own; bytes not aligned for their blocks are
//! copied. A dense K-quant matrix read there until its panels are made gives their bits.

use std::io::Write;
use std::sync::Arc;

use super::tests::Lcg;
use super::*;

const FORMATS: [GgmlDType; 5] = [
    GgmlDType::Q4_0,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

fn quantized(r: &mut Lcg, n_out: usize, k: usize, dtype: GgmlDType) -> Vec<u8> {
    let wt = Tensor::from_vec(r.vec(n_out * k), (n_out, k), &Device::Cpu).unwrap();
    QTensor::quantize(&wt, dtype)
        .unwrap()
        .data()
        .unwrap()
        .to_vec()
}

/// Whether the matrix is read in the map on `isa`: Q8_0 everywhere, the others where their
/// row kernels have SIMD.
fn in_map(dtype: GgmlDType, isa: Isa) -> bool {
    dtype == GgmlDType::Q8_0 || isa.avx2()
}

/// Every output is the scalar reference's: its bits for the K-quants (the same integers and
/// fused multiply-adds), within float rounding for Q4_0 and Q8_0 (whose SIMD paths sum blocks
/// in eight lanes, as for Q4_1); and a row in a batch gets the bits it gets alone.
fn check_reference(lin: &QLinear, dtype: GgmlDType, r: &mut Lcg, what: &str) {
    let (n, k) = (lin.n_out, lin.k);
    let exact = matches!(dtype, GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K);
    for m in [1, 2, 3, 5, 70] {
        let x = r.vec(m * k);
        let out = lin.product(&x, m);
        for (i, row) in x.chunks_exact(k).enumerate() {
            let alone = lin.product(row, 1);
            for j in 0..n {
                let (v, want) = (out[i * n + j], lin.reference(j, row));
                match exact {
                    true => assert_eq!(v.to_bits(), want.to_bits(), "{what} m={m} ({i}, {j})"),
                    false => assert!(
                        (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{what} m={m} ({i}, {j}): {v} vs {want}"
                    ),
                }
                assert_eq!(
                    v.to_bits(),
                    alone[j].to_bits(),
                    "{what} m={m} ({i}, {j}) alone"
                );
            }
        }
    }
}

/// Gate and up of one expert, each where it lies in the file (an odd gap between them, as
/// slabs of different tensors), stacked into one matrix: read in the map, every output the
/// reference's bits; the same bytes outside the map, copied.
#[test]
fn expert_rows_read_in_the_map_give_the_references_bits() {
    let mut r = Lcg(61);
    let (n, k) = (75, 512);
    for dtype in FORMATS {
        let (gate, up) = (
            quantized(&mut r, n, k, dtype),
            quantized(&mut r, n, k, dtype),
        );
        let mut file = tempfile::tempfile().unwrap();
        // Offsets even, as GGUF's aligned tensors are (the blocks' `u16` fields).
        let (at_gate, at_up) = (32, 32 + gate.len() + 6);
        file.write_all(&[7; 32]).unwrap();
        file.write_all(&gate).unwrap();
        file.write_all(&[1; 6]).unwrap();
        file.write_all(&up).unwrap();
        // SAFETY: the test's own temporary file, only read.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        for isa in Isa::available() {
            let raw = |at: usize, len: usize| {
                let bytes = &map[at..at + len];
                let t = TensorType::Ggml(dtype);
                QLinear::from_raw_in(t, &[n, k], bytes, isa, Some((&map, at)), true)
            };
            if !in_map(dtype, isa) {
                // Repacked as without a map (or left to candle: Q5_K without panels).
                if let Some(lin) = raw(at_gate, gate.len()) {
                    assert_eq!(lin.mapped_bytes(), 0, "{dtype:?} {isa:?}");
                }
                continue;
            }
            let parts = vec![
                raw(at_gate, gate.len()).unwrap(),
                raw(at_up, up.len()).unwrap(),
            ];
            let lin = QLinear::stack(parts).expect("parts stack");
            let whole = gate.len() + up.len();
            assert_eq!(lin.mapped_bytes(), whole, "{dtype:?} {isa:?}");
            assert_eq!(lin.bytes(), whole, "{dtype:?} {isa:?}");
            check_reference(&lin, dtype, &mut r, &format!("{dtype:?} {isa:?}"));
            // A row dequantised gives the file's weights, as candle reads them.
            let mut row = vec![0f32; k];
            lin.dequantize_row(n + 3, &mut row);
            let q = candle_core::quantized::ggml_file::qtensor_from_ggml(
                dtype,
                &up,
                vec![n, k],
                &Device::Cpu,
            )
            .unwrap();
            let want = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
            let want = want.to_vec1::<f32>().unwrap();
            assert!(row == want[3 * k..4 * k], "{dtype:?} {isa:?}");
        }
    }
}

/// Bytes at an offset not aligned for their blocks, or not the map's own, are copied: the same
/// bits, none of them in the map.
#[test]
fn expert_rows_not_aligned_in_the_map_are_copied() {
    let mut r = Lcg(67);
    let (n, k) = (9, 256);
    for dtype in FORMATS {
        let w = quantized(&mut r, n, k, dtype);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[0; 33]).unwrap();
        file.write_all(&w).unwrap();
        // SAFETY: the test's own temporary file, only read.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        for isa in Isa::available().into_iter().filter(|&i| in_map(dtype, i)) {
            let t = TensorType::Ggml(dtype);
            let odd = QLinear::from_raw_in(t, &[n, k], &map[33..], isa, Some((&map, 33)), true);
            let odd = odd.unwrap();
            assert_eq!(odd.mapped_bytes(), 0, "{dtype:?} {isa:?}");
            let elsewhere = QLinear::from_raw_in(t, &[n, k], &w, isa, Some((&map, 33)), true);
            assert_eq!(elsewhere.unwrap().mapped_bytes(), 0, "{dtype:?} {isa:?}");
            check_reference(&odd, dtype, &mut r, &format!("{dtype:?} {isa:?} copied"));
        }
    }
}

/// Q4_0 read as the file holds it is ggml's arithmetic: each block's exact integer
/// `Σ(q − 8)·a` times its two scales. With whole-number weights and activations whose blocks
/// sum past 2,048 (where an f16 offset sum `d·Σa`, which its repacking into Q4_1 takes, is no
/// longer exact) every instruction set gives the exact product; with random ones, the scalar
/// reference's within float rounding.
#[test]
fn q4_0_as_the_file_holds_it_is_ggmls_arithmetic() {
    let mut r = Lcg(71);
    let k = 1024;
    // Weights −8..7 (each block's −8 first: scale 1); activations 64..127 (127 first: scale 1).
    let (wf, xf) = (r.ints(k, -8, 7, -8), r.ints(k, 64, 127, 127));
    let wt = Tensor::from_vec(wf.clone(), (1, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&wt, GgmlDType::Q4_0).unwrap();
    let w: Vec<BlockQ4_0> = blocks(&q.data().unwrap()).unwrap();
    let mut a = vec![BlockQ8_1::default(); k / QK];
    quantize_q8_1(&xf, &mut a);
    assert!(
        a.iter().all(|b| b.sum > 2048),
        "block sums past f16's whole numbers"
    );
    let exact: i64 = wf.iter().zip(&xf).map(|(w, x)| *w as i64 * *x as i64).sum();
    assert_eq!(dot_q4_0_q8_1_scalar(&w, &a), exact as f32);
    for isa in Isa::available() {
        assert_eq!(isa.dot_q4_0_q8_1_checked(&w, &a), exact as f32, "{isa:?}");
    }
    let w: Vec<BlockQ4_0> = blocks(&quantized(&mut r, 1, k, GgmlDType::Q4_0)).unwrap();
    quantize_q8_1(&r.vec(k), &mut a);
    let want = dot_q4_0_q8_1_scalar(&w, &a);
    for isa in Isa::available() {
        let got = isa.dot_q4_0_q8_1_checked(&w, &a);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{isa:?}: {got} vs {want}"
        );
    }
}

/// A dense K-quant matrix loaded from a map reads its rows there until its panels are made
/// (`later.rs`): a product of a few rows runs on the file's rows, one of many rows makes the
/// panels and drops the map's pages, and every output throughout, stacked parts too, is the
/// bits of the panels made at load.
#[test]
fn panels_made_later_give_the_bits_of_panels_made_at_load() {
    let mut r = Lcg(73);
    // 528 rows: two bands (`later.rs`), the second of one panel.
    let (n, k) = (528, 256);
    for dtype in [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
        let (a, b) = (
            quantized(&mut r, n, k, dtype),
            quantized(&mut r, n, k, dtype),
        );
        let mut file = tempfile::tempfile().unwrap();
        let (at_a, at_b) = (32, 64 + a.len());
        file.write_all(&[7; 32]).unwrap();
        file.write_all(&a).unwrap();
        file.write_all(&[1; 32]).unwrap();
        file.write_all(&b).unwrap();
        // SAFETY: the test's own temporary file, only read.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        let t = TensorType::Ggml(dtype);
        for isa in Isa::available() {
            let mapped = |at: usize, len: usize| {
                QLinear::from_raw_in(t, &[n, k], &map[at..at + len], isa, Some((&map, at)), false)
            };
            let (Some(pa), Some(pb)) = (mapped(at_a, a.len()), mapped(at_b, b.len())) else {
                continue; // left to candle (Q5_K without SIMD)
            };
            let later = QLinear::stack(vec![pa, pb]).expect("parts stack");
            let at_load = [&a, &b].map(|w| QLinear::from_raw(t, &[n, k], w, isa).unwrap());
            let at_load = QLinear::stack(at_load.into()).unwrap();
            let what = format!("{dtype:?} {isa:?}");
            let pending = panels_later(t, 2 * n, k, isa);
            assert_eq!(later.later().is_some(), pending, "{what}");
            if !pending {
                continue;
            }
            assert_eq!(later.mapped_bytes(), a.len() + b.len(), "{what}");
            for (step, m) in [1, 3, PANELS_NOW_ROWS + 62, 1, 3].into_iter().enumerate() {
                let x = r.vec(m * k);
                let (got, want) = (later.product(&x, m), at_load.product(&x, m));
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{what} step {step} m={m}");
                // Made by the first product of many rows, not before.
                assert_eq!(later.later().is_some(), step < 2, "{what} step {step}");
            }
            assert_eq!(later.mapped_bytes(), 0, "{what}");
            let (mut row, mut want) = (vec![0f32; k], vec![0f32; k]);
            later.dequantize_row(n + 5, &mut row);
            at_load.dequantize_row(n + 5, &mut want);
            assert!(row == want, "{what}");
        }
    }
}
