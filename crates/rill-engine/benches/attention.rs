//! Attention against its scalar reference (issue 6): one layer of this model (9 query heads on
//! 3 KV heads of 64) for one decode row, a 64-row prefill chunk and a batched decode step, at
//! several context lengths; then a decode step of every layer of Llama 3.2 1B's shape (16
//! layers, 32 query heads on 8 KV heads of 64) at 4,096 positions, whose 128 MB of f16 cache
//! (68 MB in 8 bits) come from memory, not a cache. `cargo bench -p rill-engine --bench
//! attention`.

mod common;
use common::values;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use rill_engine::kernels::Isa;
use rill_engine::model::attention::{attend, LayerKv, Scores, Shape, Span};
use rill_engine::model::KvType;

/// `n` random keys and values stored as `kind`.
fn cache(n: usize, seed: u64, kind: KvType) -> LayerKv {
    let rows = |seed| {
        let mut r = kind.rows();
        r.put(0, &values(n, seed));
        r
    };
    LayerKv {
        k: rows(seed),
        v: rows(seed + 1),
        start: 0,
    }
}

fn attention(c: &mut Criterion) {
    let shape = Shape {
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
    };
    let (qw, kw) = (9 * 64, 3 * 64);
    let mut g = c.benchmark_group("attention, one layer");
    g.sample_size(20);
    // One decode row, a 64-row prefill chunk, and a batched decode step: one row of each of
    // four sequences.
    for (seqs, rows, context) in [
        (1, 1usize, 512usize),
        (1, 1, 2048),
        (1, 64, 512),
        (4, 1, 256),
    ] {
        let caches: Vec<LayerKv> = (0..seqs)
            .map(|s| cache(context * kw, 1 + 2 * s, KvType::F16))
            .collect();
        let q = values(seqs as usize * rows * qw, 3);
        let mut out = vec![0f32; seqs as usize * rows * qw];
        let spans: Vec<Span> = caches
            .iter()
            .map(|kv| Span {
                both_ways: &[],
                t: rows,
                pos: context - rows,
                kv,
            })
            .collect();
        let name = match seqs {
            1 => format!("{rows} rows, {context} positions"),
            _ => format!("{seqs} sequences × {rows} row, {context} positions"),
        };
        for isa in Isa::available() {
            g.bench_function(BenchmarkId::new(&name, format!("{isa:?}")), |b| {
                b.iter(|| {
                    attend(
                        shape,
                        Scores::standard(shape.head_dim),
                        black_box(&q),
                        qw,
                        &spans,
                        &mut out,
                        isa,
                    )
                })
            });
        }
    }
    g.finish();
}

/// One decode row through every layer of a 1B model at 4,096 positions, f16 and 8-bit.
fn long_context(c: &mut Criterion) {
    let shape = Shape {
        n_head: 32,
        n_kv_head: 8,
        head_dim: 64,
    };
    let (qw, kw, layers, context) = (32 * 64, 8 * 64, 16, 4096);
    let mut g = c.benchmark_group("attention, 1B shape, 16 layers, one decode row");
    g.sample_size(10);
    for kind in [KvType::F16, KvType::Q8_0] {
        let caches: Vec<LayerKv> = (0..layers)
            .map(|l| cache(context * kw, 10 + 2 * l as u64, kind))
            .collect();
        let q = values(qw, 3);
        let mut out = vec![0f32; qw];
        let name = format!("{context} positions, {} cache", kind.name());
        for isa in Isa::available().into_iter().filter(|i| *i != Isa::Scalar) {
            g.bench_function(BenchmarkId::new(&name, format!("{isa:?}")), |b| {
                b.iter(|| {
                    for kv in &caches {
                        let span = [Span {
                            both_ways: &[],
                            t: 1,
                            pos: context - 1,
                            kv,
                        }];
                        let how = Scores::standard(shape.head_dim);
                        attend(shape, how, black_box(&q), qw, &span, &mut out, isa);
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, attention, long_context);
criterion_main!(benches);
