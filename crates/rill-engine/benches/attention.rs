//! Attention against its scalar reference (issue 6): one layer of this model (9 query heads on
//! 3 KV heads of 64) for one decode row and for a 64-row prefill chunk, at several context
//! lengths. `cargo bench -p rill-engine --bench attention`.

mod common;
use common::values;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use half::f16;
use rill_engine::kernels::Isa;
use rill_engine::model::attention::{attend, LayerKv, Shape, Span};

fn attention(c: &mut Criterion) {
    let shape = Shape {
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
    };
    let (qw, kw) = (9 * 64, 3 * 64);
    let mut g = c.benchmark_group("attention, one layer");
    g.sample_size(20);
    for (rows, context) in [(1usize, 512usize), (1, 2048), (64, 512)] {
        let kv = LayerKv {
            k: values(context * kw, 1)
                .into_iter()
                .map(f16::from_f32)
                .collect(),
            v: values(context * kw, 2)
                .into_iter()
                .map(f16::from_f32)
                .collect(),
        };
        let q = values(rows * qw, 3);
        let mut out = vec![0f32; rows * qw];
        let spans = [Span {
            t: rows,
            pos: context - rows,
            kv: &kv,
        }];
        for isa in Isa::available() {
            g.bench_function(
                BenchmarkId::new(
                    format!("{rows} rows, {context} positions"),
                    format!("{isa:?}"),
                ),
                |b| b.iter(|| attend(shape, black_box(&q), qw, &spans, &mut out, isa)),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, attention);
criterion_main!(benches);
