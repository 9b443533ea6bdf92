//! The quantised kernels against their scalar reference (issue 6): one dot product over this
//! model's 576 columns, and whole matmuls of its shapes for one row (a decode step) and 64 rows
//! (a prefill chunk). `cargo bench -p rill-engine --bench kernels`.

mod common;
use common::values;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use rill_engine::kernels::{
    quantize_q8_0, quantize_q8_1, BlockQ4_1, BlockQ8_0, BlockQ8_1, Isa, QLinear,
};

fn dots(c: &mut Criterion) {
    const BLOCKS: usize = 18; // 576 columns
    let w = values(BLOCKS * 32, 1);
    let x = values(BLOCKS * 32, 2);
    let mut x1 = vec![BlockQ8_1::default(); BLOCKS];
    quantize_q8_1(&x, &mut x1);
    let mut x8 = vec![BlockQ8_0::default(); BLOCKS];
    quantize_q8_0(&x, &mut x8);
    let mut w8 = vec![BlockQ8_0::default(); BLOCKS];
    quantize_q8_0(&w, &mut w8);
    // Q4_1 blocks with arbitrary nibbles and scales: the kernel's speed does not depend on them.
    let w4: Vec<BlockQ4_1> = (0..BLOCKS)
        .map(|i| BlockQ4_1 {
            d: half::f16::from_f32(0.01).to_bits(),
            m: half::f16::from_f32(-0.1).to_bits(),
            qs: std::array::from_fn(|j| (i * 7 + j * 13) as u8),
        })
        .collect();
    let mut g = c.benchmark_group("dot, 576 columns");
    for isa in Isa::available() {
        g.bench_function(BenchmarkId::new("q4_1·q8_1", format!("{isa:?}")), |b| {
            b.iter(|| isa.dot_q4_1_q8_1(black_box(&w4), black_box(&x1)))
        });
        g.bench_function(BenchmarkId::new("q8_0·q8_0", format!("{isa:?}")), |b| {
            b.iter(|| isa.dot_q8_0_q8_0(black_box(&w8), black_box(&x8)))
        });
    }
    g.finish();
}

fn matmuls(c: &mut Criterion) {
    // SmolLM2's FFN up projection (1536 × 576, Q4_1) and tied output (49152 × 576, Q8_0); a
    // 1B model's up projection (8192 × 2048) in each format the kernels run: Q4_0, Q4_K, Q5_K and
    // Q6_K as the file holds them, Q4_1 and Q8_0 as they ran before; and four times as many
    // rows ("big": 39–71 MB, more than the cache holds, as in a real decode step).
    for (name, n_out, k, dtype) in [
        ("ffn_up q4_1", 1536, 576, GgmlDType::Q4_1),
        ("output q8_0", 49152, 576, GgmlDType::Q8_0),
        ("1B ffn_up q4_1", 8192, 2048, GgmlDType::Q4_1),
        ("1B ffn_up q4_0", 8192, 2048, GgmlDType::Q4_0),
        ("1B ffn_up q4_k", 8192, 2048, GgmlDType::Q4K),
        ("1B ffn_up q5_k", 8192, 2048, GgmlDType::Q5K),
        ("1B ffn_up q6_k", 8192, 2048, GgmlDType::Q6K),
        ("1B ffn_up q8_0", 8192, 2048, GgmlDType::Q8_0),
        ("big q4_1", 32768, 2048, GgmlDType::Q4_1),
        ("big q4_k", 32768, 2048, GgmlDType::Q4K),
        ("big q6_k", 32768, 2048, GgmlDType::Q6K),
        ("big q8_0", 32768, 2048, GgmlDType::Q8_0),
    ] {
        let wt = Tensor::from_vec(values(n_out * k, 3), (n_out, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&wt, dtype).unwrap();
        let mut g = c.benchmark_group(format!("matmul {name}"));
        g.sample_size(20);
        for rows in [1usize, 4, 64] {
            let x = values(rows * k, 4);
            let mut out = vec![0f32; rows * n_out];
            for isa in Isa::available() {
                // Q5_K without AVX2 is left to candle: nothing of ours to measure.
                let Some(lin) = QLinear::from_qtensor(&q, isa) else {
                    continue;
                };
                g.bench_function(
                    BenchmarkId::new(format!("{rows} rows"), format!("{isa:?}")),
                    |b| b.iter(|| lin.matmul(black_box(&x), rows, &mut out)),
                );
            }
        }
        g.finish();
    }
}

criterion_group!(benches, dots, matmuls);
criterion_main!(benches);
