//! Attention against its scalar reference (issue 6): one layer of this model (9 query heads on
//! 3 KV heads of 64) for one decode row, a 64-row prefill chunk and a batched decode step, at
//! several context lengths. `cargo bench -p rill-engine --bench attention`.

mod common;
use common::values;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use half::f16;
use rill_engine::kernels::Isa;
use rill_engine::model::attention::{attend, LayerKv, Scores, Shape, Span};

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
            .map(|s| LayerKv {
                k: values(context * kw, 1 + 2 * s)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect(),
                v: values(context * kw, 2 + 2 * s)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect(),
                start: 0,
            })
            .collect();
        let q = values(seqs as usize * rows * qw, 3);
        let mut out = vec![0f32; seqs as usize * rows * qw];
        let spans: Vec<Span> = caches
            .iter()
            .map(|kv| Span {
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

criterion_group!(benches, attention);
criterion_main!(benches);
