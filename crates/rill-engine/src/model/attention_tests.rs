//! Tests of our attention (`attention.rs`): every path against the definition, and the bits a
//! query gets in any step, alone or beside others.

use super::super::kv_rows::{KvType, Q8_BLOCK};
use super::*;
use crate::kernels::tests::Lcg;

fn cache(rng: &mut Lcg, positions: usize, width: usize) -> LayerKv {
    cache_of(rng, positions, width, KvType::F16)
}

/// Random keys and values stored as `kind`.
fn cache_of(rng: &mut Lcg, positions: usize, width: usize, kind: KvType) -> LayerKv {
    let mut f = |n| {
        let mut rows = kind.rows();
        rows.put(0, &rng.vec(n));
        rows
    };
    LayerKv {
        k: f(positions * width),
        v: f(positions * width),
        start: 0,
    }
}

/// The kinds of store a head of `hd` values can have.
fn kinds(hd: usize) -> impl Iterator<Item = KvType> {
    [KvType::F16, KvType::Q8_0]
        .into_iter()
        .filter(move |k| k.fits(hd))
}

/// softmax(cap(q·kᵀ·scale))·v over the window before key `n_keys` in f64, straight from
/// the definition; a head's sink is one more score in the softmax, with no value.
fn reference(
    shape: Shape,
    how: Scores,
    q: &[f32],
    kv: &LayerKv,
    head: usize,
    n_keys: usize,
) -> Vec<f64> {
    let hd = shape.head_dim;
    let g = head / (shape.n_head / shape.n_kv_head);
    let first = how.window.map_or(0, |w| n_keys.saturating_sub(w));
    let at = |x: &KvRows, j: usize| {
        let mut row = vec![0f32; hd];
        x.read((first + j) * shape.kv_width() + g * hd, &mut row);
        row
    };
    let n_keys = n_keys - first;
    let s: Vec<f64> = (0..n_keys)
        .map(|j| {
            let k = at(&kv.k, j);
            let s = q
                .iter()
                .zip(&k)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * how.scale as f64;
            match how.softcap {
                Some(c) => c as f64 * (s / c as f64).tanh(),
                None => s,
            }
        })
        .collect();
    let sink = how.sinks.map(|s| s[head] as f64);
    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let max = sink.map_or(max, |k| max.max(k));
    let mut e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
    let mut sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |k| (k - max).exp());
    if how.f16_weights {
        e.iter_mut()
            .for_each(|x| *x = f16::from_f64(*x / sum).to_f64());
        sum = 1.0;
    }
    (0..hd)
        .map(|c| {
            (0..n_keys)
                .map(|j| e[j] * at(&kv.v, j)[c] as f64)
                .sum::<f64>()
                / sum
        })
        .collect()
}

#[test]
fn every_path_equals_the_definition() {
    let mut rng = Lcg(7);
    // Head sizes: this model's 64 (three query heads per KV head), 24 (not a multiple of 32;
    // one head per KV head), 32 with eight heads on one KV head (two passes of four), 16
    // with two, 40 with seven (four and three), and 20 (scalar only).
    for (hd, n_head, n_kv) in [
        (64, 9, 3),
        (24, 4, 4),
        (32, 8, 1),
        (16, 6, 3),
        (40, 7, 1),
        (20, 2, 1),
    ] {
        let shape = Shape {
            n_head,
            n_kv_head: n_kv,
            head_dim: hd,
        };
        // Ragged lengths: under and over a vector, and long enough to go to the pool; f16
        // and 8-bit stores.
        let cases = [(0, 1), (6, 3), (8, 1), (300, 5), (2000, 2)];
        for ((pos, t), kind) in cases
            .into_iter()
            .flat_map(|c| kinds(hd).map(move |k| (c, k)))
        {
            let kv = cache_of(&mut rng, pos + t, shape.kv_width(), kind);
            let q = rng.vec(t * n_head * hd);
            let spans = [Span {
                both_ways: &[],
                t,
                pos,
                kv: &kv,
            }];
            // Llama's scores, and Gemma 2's: unscaled (the queries were), soft-capped at a
            // cap the scores reach, over a window shorter and longer than the context.
            let gemma = |window| Scores {
                scale: 1.0,
                softcap: Some(0.5),
                window: Some(window),
                f16_weights: true,
                sinks: None,
            };
            // gpt-oss's: a sink per head, above and below the scores, over a window.
            let sinks: Vec<f32> = (0..n_head).map(|h| h as f32 - 2.0).collect();
            let oss = Scores {
                window: Some(4),
                f16_weights: true,
                sinks: Some(&sinks),
                ..Scores::standard(hd)
            };
            let sinks_only = Scores {
                sinks: Some(&sinks),
                ..Scores::standard(hd)
            };
            for how in [Scores::standard(hd), gemma(4), gemma(500), oss, sinks_only] {
                for isa in crate::kernels::Isa::available() {
                    let mut out = vec![0f32; t * n_head * hd];
                    attend(shape, how, &q, n_head * hd, &spans, &mut out, isa);
                    for (c, y) in out.chunks_exact(hd).enumerate() {
                        let (i, head) = (c / n_head, c % n_head);
                        let q = &q[c * hd..][..hd];
                        let want = reference(shape, how, q, &kv, head, pos + i + 1);
                        // f16 weights: ours and the f64 definition's can round to
                        // neighbouring halves (2⁻¹¹ apart, relative).
                        let tol = if how.f16_weights { 1e-3 } else { 1e-5 };
                        for (a, b) in y.iter().zip(&want) {
                            assert!(
                                (*a as f64 - b).abs() < tol,
                                "{isa:?} {kind:?} {how:?} hd {hd} pos {pos} row {i} head \
                                 {head}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_query_gives_the_same_bits_in_any_step() {
    // The same 12 rows of one sequence run as one step, as steps of 5, and one by one, and
    // beside another sequence: each row's output is identical.
    let mut rng = Lcg(11);
    let shape = Shape {
        n_head: 9,
        n_kv_head: 3,
        head_dim: 64,
    };
    let (pos, rows, qw) = (700, 12, 9 * 64);
    for (kind, isa) in kinds(64).flat_map(|k| {
        crate::kernels::Isa::available()
            .into_iter()
            .map(move |i| (k, i))
    }) {
        let kv = cache_of(&mut rng, pos + rows, shape.kv_width(), kind);
        let other = cache_of(&mut rng, 40, shape.kv_width(), kind);
        let q = rng.vec(rows * qw);
        let run = |from: usize, t: usize, beside: bool| {
            let mut spans = Vec::new();
            let mut qs = Vec::new();
            if beside {
                spans.push(Span {
                    both_ways: &[],
                    t: 1,
                    pos: 39,
                    kv: &other,
                });
                qs.extend(rng_free_row(qw));
            }
            spans.push(Span {
                both_ways: &[],
                t,
                pos: pos + from,
                kv: &kv,
            });
            qs.extend_from_slice(&q[from * qw..(from + t) * qw]);
            let mut out = vec![0f32; qs.len()];
            attend(
                shape,
                Scores::standard(shape.head_dim),
                &qs,
                qw,
                &spans,
                &mut out,
                isa,
            );
            out[out.len() - t * qw..].to_vec()
        };
        let whole = run(0, rows, false);
        let mut fives = Vec::new();
        for from in (0..rows).step_by(5) {
            fives.extend(run(from, 5.min(rows - from), false));
        }
        let singles: Vec<f32> = (0..rows).flat_map(|i| run(i, 1, i % 2 == 0)).collect();
        assert!(
            whole == fives && whole == singles,
            "{isa:?} {kind:?}: a row depends on its step"
        );
    }
}

/// A windowed layer's cache that has dropped the rows before its queries' windows gives
/// them the same bits as the whole cache.
#[test]
fn a_window_sees_the_same_bits_in_a_cache_that_dropped_its_past() {
    let mut rng = Lcg(5);
    let shape = Shape {
        n_head: 4,
        n_kv_head: 2,
        head_dim: 32,
    };
    let (pos, t, window, qw) = (300, 6, 40, 4 * 32);
    let whole = cache(&mut rng, pos + t, shape.kv_width());
    let q = rng.vec(t * qw);
    let how = Scores {
        window: Some(window),
        ..Scores::standard(shape.head_dim)
    };
    // The first row's window starts at pos + 1 − window.
    let from = pos + 1 - window;
    let (a, b) = (from * shape.kv_width(), whole.k.len());
    let cut = LayerKv {
        k: whole.k.copy(a, b, 0),
        v: whole.v.copy(a, b, 0),
        start: from,
    };
    for isa in crate::kernels::Isa::available() {
        let run = |kv: &LayerKv| {
            let mut out = vec![0f32; t * qw];
            attend(
                shape,
                how,
                &q,
                qw,
                &[Span {
                    both_ways: &[],
                    t,
                    pos,
                    kv,
                }],
                &mut out,
                isa,
            );
            out
        };
        assert!(run(&whole) == run(&cut), "{isa:?}");
    }
}

/// A query whose window begins before the cache's first row is refused, never read out of
/// bounds.
#[test]
#[should_panic(expected = "window starts before its cache")]
fn a_cache_that_dropped_a_window_is_refused() {
    let shape = Shape {
        n_head: 1,
        n_kv_head: 1,
        head_dim: 8,
    };
    let kv = LayerKv {
        k: KvRows::F16(vec![f16::ZERO; 8 * 8]),
        v: KvRows::F16(vec![f16::ZERO; 8 * 8]),
        start: 10,
    };
    let how = Scores {
        window: Some(8),
        ..Scores::standard(8)
    };
    let mut out = vec![0f32; 8];
    let span = [Span {
        both_ways: &[],
        t: 1,
        pos: 12,
        kv: &kv,
    }];
    attend(
        shape,
        how,
        &[0.0; 8],
        8,
        &span,
        &mut out,
        crate::kernels::Isa::Scalar,
    );
}

/// The heads of a KV group share their passes over its keys and values; each head's output
/// is the same, bit for bit, as when it runs alone.
#[test]
fn a_head_gives_the_same_bits_alone_and_in_its_group() {
    let mut rng = Lcg(17);
    // (A step of one row with few keys runs on the calling thread, every KV head in one task:
    // 64/16/4 is Llama 3.2 1B's four heads a KV head, and 120 keys cross the passes' chunks
    // of 64 positions.)
    for (hd, n_head, n_kv) in [(64, 9, 3), (32, 8, 1), (40, 7, 1), (16, 6, 3), (64, 16, 4)] {
        let shape = Shape {
            n_head,
            n_kv_head: n_kv,
            head_dim: hd,
        };
        let alone = Shape {
            n_head: 1,
            n_kv_head: 1,
            head_dim: hd,
        };
        let per_group = n_head / n_kv;
        for (n_keys, kind) in [1, 2, 5, 37, 120]
            .into_iter()
            .flat_map(|n| kinds(hd).map(move |k| (n, k)))
        {
            let kv = cache_of(&mut rng, n_keys, shape.kv_width(), kind);
            let q = rng.vec(n_head * hd);
            let spans = [Span {
                both_ways: &[],
                t: 1,
                pos: n_keys - 1,
                kv: &kv,
            }];
            for isa in crate::kernels::Isa::available() {
                let mut together = vec![0f32; n_head * hd];
                attend(
                    shape,
                    Scores::standard(hd),
                    &q,
                    n_head * hd,
                    &spans,
                    &mut together,
                    isa,
                );
                for head in 0..n_head {
                    // A cache of this head's KV head only.
                    let g = head / per_group;
                    let own = |x: &KvRows| own_head(x, shape.kv_width(), g, hd);
                    let kv1 = LayerKv {
                        k: own(&kv.k),
                        v: own(&kv.v),
                        start: 0,
                    };
                    let span = [Span {
                        both_ways: &[],
                        t: 1,
                        pos: n_keys - 1,
                        kv: &kv1,
                    }];
                    let mut y = vec![0f32; hd];
                    attend(
                        alone,
                        Scores::standard(hd),
                        &q[head * hd..][..hd],
                        hd,
                        &span,
                        &mut y,
                        isa,
                    );
                    assert!(
                        y == together[head * hd..][..hd],
                        "{isa:?} {kind:?} hd {hd} {n_head}/{n_kv} heads, {n_keys} keys: \
                         head {head}"
                    );
                }
            }
        }
    }
}

/// KV head `g`'s values (`hd` of each row of `width`), as they are stored.
fn own_head(x: &KvRows, width: usize, g: usize, hd: usize) -> KvRows {
    match x {
        KvRows::F16(x) => KvRows::F16(pick(x, width, g, hd)),
        KvRows::Q8 { q, d } => KvRows::Q8 {
            q: pick(q, width, g, hd),
            d: pick(d, width / Q8_BLOCK, g, hd / Q8_BLOCK),
        },
    }
}

/// Part `g` (`h` long) of every row of `w` in `x`.
fn pick<T: Clone>(x: &[T], w: usize, g: usize, h: usize) -> Vec<T> {
    x.chunks_exact(w)
        .flat_map(|row| row[g * h..(g + 1) * h].to_vec())
        .collect()
}

fn rng_free_row(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin()).collect()
}

#[test]
fn rope_rotates_like_candle() {
    for neox in [false, true] {
        rope_rotates_like_candles(neox);
    }
}

fn rope_rotates_like_candles(neox: bool) {
    let mut rng = Lcg(3);
    let (t, heads, hd, pos, pairs) = (3, 2, 8, 5, 4);
    let cos: Vec<f32> = (0..(pos + t) * pairs)
        .map(|i| (i as f32 * 0.1).cos())
        .collect();
    let sin: Vec<f32> = (0..(pos + t) * pairs)
        .map(|i| (i as f32 * 0.1).sin())
        .collect();
    let rope = Rope {
        cos: cos.clone(),
        sin: sin.clone(),
        pairs,
        neox,
    };
    let x = rng.vec(t * heads * hd);
    let mut ours = x.clone();
    for (i, row) in ours.chunks_exact_mut(heads * hd).enumerate() {
        rope.apply(row, hd, pos + i);
    }
    let dev = candle_core::Device::Cpu;
    let table =
        |v: &[f32]| candle_core::Tensor::from_slice(&v[pos * pairs..], (t, pairs), &dev).unwrap();
    let xt = candle_core::Tensor::from_slice(&x, (1, t, heads, hd), &dev)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap();
    let rotate = match neox {
        true => candle_nn::rotary_emb::rope,
        false => candle_nn::rotary_emb::rope_i,
    };
    let theirs = rotate(&xt, &table(&cos), &table(&sin))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(ours, theirs);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_exp_is_within_an_ulp() {
    if !crate::kernels::Isa::detect().avx2() {
        return;
    }
    let xs: Vec<f32> = (0..20_000).map(|i| -90.0 + i as f32 * 0.0045).collect();
    let mut ys = xs.clone();
    let max = 0.0f32;
    ys.push(max);
    // SAFETY: AVX2, FMA and F16C were detected above.
    unsafe { avx2::exp_in_place(&mut ys, None) };
    for (x, y) in xs.iter().zip(&ys) {
        let want = (*x as f64).exp();
        if want < f32::MIN_POSITIVE as f64 * 4.0 {
            assert!(*y < 1e-36, "e^{x}: {y}");
            continue;
        }
        let ulp = f32::EPSILON as f64 * want;
        assert!((*y as f64 - want).abs() <= ulp, "e^{x}: {y} vs {want}");
    }
}
