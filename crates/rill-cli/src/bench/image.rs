//! `rill bench --image FILE`: what a question about a picture costs — the picture decoded,
//! encoded by the projector paired with the model (its rows), and the time to first token of
//! a question about it as a user waits for it (decoding, encoding and prefill included) —
//! beside llama.cpp's `llama-mtmd-cli`, which prints its encode and decode times (BENCHMARKS.md).

use std::time::Instant;

use anyhow::{Context, Result};
use rill_engine::vision::{Picture, Projector};
use rill_engine::{GenerateRequest, ImageData, Message, SamplingParams};

use super::BenchArgs;

/// Encodes of the picture timed: the fastest is reported, with the median and every run.
const RUNS: usize = 3;

pub(super) fn bench_image(
    a: &BenchArgs,
    handle: &rill_engine::Handle,
    path: &std::path::Path,
) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let projector_path = handle
        .projector_path()
        .context("the model has no vision projector: give one with --mmproj")?
        .to_owned();
    // The question first, with a picture not seen before: what a user waits for.
    let started = Instant::now();
    let req = GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(a.gen_tokens),
        ignore_eos: true,
        ..GenerateRequest::chat(vec![Message {
            images: vec![ImageData::new(bytes.clone())],
            ..Message::user("What is in this picture?")
        }])
    };
    let answer = super::measure(started, handle.generate(req)?)?;
    // Then the parts alone, on a projector of its own (the engine's keeps the rows it made).
    let t = Instant::now();
    let picture = Picture::decode(&bytes)?;
    let decode_ms = t.elapsed().as_secs_f64() * 1e3;
    let projector = Projector::load(&projector_path)?;
    let mut encode_ms = Vec::with_capacity(RUNS);
    let mut rows = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        rows = projector.encode(&picture)?.rows;
        encode_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut sorted = encode_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let report = serde_json::json!({
        "image": path.display().to_string(),
        "width": picture.width(),
        "height": picture.height(),
        "image_tokens": rows,
        "decode_ms": decode_ms,
        "encode_ms": sorted[0],
        "encode_median_ms": sorted[RUNS / 2],
        "encode_runs_ms": encode_ms,
        "prompt_tokens": answer.usage.prompt_tokens,
        "ttft_ms": answer.ttft_ms,
        "decode_tps": answer.decode_tps,
    });
    match a.json {
        true => println!("{report}"),
        false => {
            println!(
                "{} ({} × {}): {rows} image tokens, decoded in {decode_ms:.0} ms, encoded in \
                 {:.0} ms (median of {RUNS}: {:.0} ms)",
                path.display(),
                picture.width(),
                picture.height(),
                sorted[0],
                sorted[RUNS / 2],
            );
            println!(
                "a question about it: {} prompt tokens, first token after {:.0} ms (decoding, \
                 encoding and prefill), then {:.1} tok/s",
                answer.usage.prompt_tokens, answer.ttft_ms, answer.decode_tps
            );
        }
    }
    Ok(())
}
