//! `rill bench`: prefill and decode speed, time to first token, inter-token gaps and peak
//! memory, for one stream or several at once (docs/architecture.md, "The CLI's contract").
//!
//! The prompt is real text tokenized and repeated to the asked length, run as raw tokens (no
//! template), greedy, ignoring end-of-generation so every stream makes exactly `--gen-tokens`;
//! or, with `--prompt-file`, a file's text asked in the chat template, answered until the model
//! ends it (at most `--gen-tokens`). `--lookup` and `--draft-model` measure speculative
//! decoding by prompt lookup and with a draft model; `--image` a question about a picture.
//! A short warm-up generation runs first so thread start-up is not measured.

mod image;
mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rill_engine::kernels::Isa;
use rill_engine::{Event, GenerateRequest, Message, Prompt, SamplingParams, Speculation, Usage};

use crate::ModelArgs;
use report::{percentiles, print_report, Report};

const TEXT: &str = "The river carried the light of the morning down from the hills, past the mills and the \
orchards, through the town where the market opened early and the bakers had already sold their first loaves. \
Children ran along the bank, counting boats, and an old ferryman told anyone who would listen how the water \
had risen in the spring of his youth, when the bridge was still made of wood and the lanterns burned oil. ";

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Generations running at once.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// Long generations already streaming while the measured ones run (the flow's "short
    /// question while long answers stream" case).
    #[arg(long, default_value_t = 0)]
    background: usize,
    /// Instead: a conversation of this many turns, reporting each turn's TTFT (prefix reuse).
    #[arg(long)]
    turns: Option<usize>,
    /// Report this many candidates with every token (what `logprobs` and the probability
    /// views cost); 0 = off.
    #[arg(long, default_value_t = 0)]
    candidates: usize,
    /// Instead: the next-token preview the sampling panel draws — once for a prompt not seen
    /// before (it runs through the model), then this many times as a slider moves.
    #[arg(long)]
    preview: Option<usize>,
    /// Positions already in the cache before the measured run (llama-bench's `-d`): that many
    /// tokens are run first and kept, then the measured prompt follows them, so its prefill and
    /// decode run at that depth. One stream only.
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Every measured answer constrained by a JSON schema or a grammar.
    #[command(flatten)]
    constraint: crate::constrain::ConstraintArgs,
    /// The measured prompt: this file's text as the user's message, in the model's chat
    /// template, answered until the model ends it (at most `--gen-tokens`).
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Speculative decoding by prompt lookup for every measured answer.
    #[arg(long)]
    lookup: bool,
    /// Instead: drafts the model always rejects (what failed speculation costs).
    #[arg(long, hide = true, conflicts_with = "lookup")]
    contrary: bool,
    /// Instead: a question about this picture (with the model's vision projector, `--mmproj`):
    /// the time to decode and encode it, and the time to first token.
    #[arg(long, value_name = "FILE")]
    image: Option<PathBuf>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The peak resident set (`VmHWM`), mapped file pages included.
pub fn peak_rss_mb() -> f64 {
    status_mb("VmHWM")
}

/// Memory of the process's own now (`RssAnon`): the resident set without the pages of mapped
/// files, which the page cache holds and shares (a model's MXFP4 experts are read in its map).
pub fn anon_rss_mb() -> f64 {
    status_mb("RssAnon")
}

/// A line of `/proc/self/status` in MiB, as the figures have always been (0 where there is
/// none).
fn status_mb(field: &str) -> f64 {
    rill_engine::kernels::process_status_bytes(field).map_or(0.0, |b| b as f64 / (1024.0 * 1024.0))
}

struct StreamResult {
    submitted: Instant,
    ttft_ms: f64,
    gaps_ms: Vec<f64>,
    prefill_tps: f64,
    decode_tps: f64,
    reused_tokens: usize,
    text: String,
    /// When each token came.
    times: Vec<Instant>,
    usage: Usage,
}

impl StreamResult {
    fn first(&self) -> Option<Instant> {
        self.times.first().copied()
    }
    fn last(&self) -> Option<Instant> {
        self.times.last().copied()
    }
}

/// Tokens per second over the window in which any of `results` was producing tokens.
fn aggregate_tps(results: &[StreamResult]) -> f64 {
    let first = results.iter().filter_map(StreamResult::first).min();
    let last = results.iter().filter_map(StreamResult::last).max();
    match (first, last) {
        (Some(f), Some(l)) if l > f => {
            results.iter().map(|r| r.times.len()).sum::<usize>() as f64 / (l - f).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// Tokens per second over the window in which all of `results` were decoding: the tokens that
/// came after the last stream's first and up to the first stream's last.
fn together_tps(results: &[StreamResult]) -> f64 {
    let from = results.iter().filter_map(StreamResult::first).max();
    let to = results.iter().filter_map(StreamResult::last).min();
    match (from, to) {
        (Some(f), Some(t)) if t > f => {
            let inside = |r: &StreamResult| r.times.iter().filter(|&&x| x > f && x <= t).count();
            results.iter().map(inside).sum::<usize>() as f64 / (t - f).as_secs_f64()
        }
        _ => 0.0,
    }
}

pub fn bench(a: BenchArgs) -> Result<()> {
    if a.prompt_tokens == 0 || a.gen_tokens == 0 || a.streams == 0 {
        bail!("--prompt-tokens, --gen-tokens and --streams must be ≥ 1");
    }
    if a.depth > 0 && (a.streams > 1 || a.background > 0) {
        bail!("--depth measures one stream alone: leave --streams and --background out");
    }
    let grammar = a.constraint.grammar()?;
    let started = Instant::now();
    let speculation = match a.contrary {
        true => Speculation::Contrary,
        false => a.model.speculation(a.lookup)?,
    };
    let engine = a.model.start()?;
    let load_ms = started.elapsed().as_secs_f64() * 1e3;
    let handle = engine.handle();
    let base = handle.tokenize_prompt(&Prompt::Text(TEXT.repeat(4)))?;
    let asked = match &a.prompt_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Some(handle.tokenize_prompt(&Prompt::Messages(vec![Message::user(text)]))?)
        }
        None => None,
    };
    let request = |ids: Vec<u32>, n: usize| GenerateRequest {
        params: SamplingParams::greedy(),
        max_tokens: Some(n),
        // A file's question is answered until the model ends it.
        ignore_eos: asked.is_none(),
        top_candidates: a.candidates,
        grammar: grammar.clone(),
        speculation,
        ..GenerateRequest::new(Prompt::Tokens(ids))
    };

    // A first answer right after loading: one prompt token, one answer token.
    handle
        .generate(request(base[..1].to_vec(), 1))?
        .collect_blocking()?;
    let first_token_ms = started.elapsed().as_secs_f64() * 1e3;
    // Warm-up: thread pools, page faults, allocator.
    let warmup = Instant::now();
    handle
        .generate(request(base[..16.min(base.len())].to_vec(), 4))?
        .collect_blocking()?;
    // Then the panels of weights read in the file's map until now, made while the engine is
    // idle (`kernels/later.rs`): the runs below measure the model at full speed.
    while !handle.weights_ready() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let warmup_ms = warmup.elapsed().as_secs_f64() * 1e3;

    if let Some(path) = &a.image {
        return image::bench_image(&a, &handle, path);
    }
    if let Some(turns) = a.turns {
        return bench_turns(&a, &handle, turns);
    }
    if let Some(moves) = a.preview {
        return bench_preview(&a, &handle, &base, moves);
    }

    // Background answers: long, started first, running until the measurement is over.
    let background: Vec<_> = (0..a.background)
        .map(|b| {
            let ids: Vec<u32> = base
                .iter()
                .cycle()
                .skip(100 + b * 13)
                .take(a.prompt_tokens.max(64))
                .copied()
                .collect();
            let mut gen = handle.generate(request(ids, handle.context_length() / 2))?;
            let control = gen.control().clone();
            // Wait until it streams, then drain it in the background, timing its tokens.
            while !matches!(gen.blocking_next(), Some(Event::Token { .. }) | None) {}
            let drain = std::thread::spawn(move || {
                gen.filter(|e| matches!(e, Event::Token { .. }))
                    .map(|_| Instant::now())
                    .collect::<Vec<_>>()
            });
            Ok((control, drain))
        })
        .collect::<Result<Vec<_>>>()?;

    // The depth's tokens, run and kept first: the measured prompt follows them and reuses
    // their cache (prefix reuse), so it runs at that depth.
    let depth: Vec<u32> = base.iter().cycle().skip(3).take(a.depth).copied().collect();
    if a.depth > 0 {
        let before = handle.prefix_cache_bytes();
        handle
            .generate(request(depth.clone(), 1))?
            .collect_blocking()?;
        let t = Instant::now();
        while handle.prefix_cache_bytes() <= before {
            if t.elapsed().as_secs() > 30 {
                bail!("the depth's cache was not kept (is the KV budget too small for it?)");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    let prompts: Vec<Vec<u32>> = (0..a.streams)
        .map(|s| match &asked {
            Some(ids) => depth.iter().chain(ids).copied().collect(),
            None => {
                let prompt = base.iter().cycle().skip(s * 7).take(a.prompt_tokens);
                depth.iter().chain(prompt).copied().collect()
            }
        })
        .collect();
    let prompt_tokens = asked.as_ref().map_or(a.prompt_tokens, Vec::len);
    let gens = prompts
        .into_iter()
        .map(|p| Ok((Instant::now(), handle.generate(request(p, a.gen_tokens))?)))
        .collect::<Result<Vec<_>>>()?;
    let workers: Vec<_> = gens
        .into_iter()
        .map(|(submitted, gen)| std::thread::spawn(move || measure(submitted, gen)))
        .collect();
    let mut results = Vec::new();
    for w in workers {
        results.push(
            w.join()
                .map_err(|_| anyhow::anyhow!("a benchmark stream panicked"))??,
        );
    }
    let mut background_tokens = Vec::new();
    for (control, drain) in background {
        control.cancel()?;
        background_tokens.push(drain.join().unwrap_or_default());
    }

    if let Some(r) = results.iter().find(|r| r.reused_tokens < a.depth) {
        bail!(
            "the measured prompt reused {} of the depth's {} tokens",
            r.reused_tokens,
            a.depth
        );
    }
    let mut report = Report::new(&a, prompt_tokens, &results);
    report.load_ms = load_ms;
    report.first_token_ms = first_token_ms;
    report.warmup_ms = warmup_ms;
    if a.model.mlock {
        report.locked_mb = Some(handle.locked_weight_bytes() as f64 / 1e6);
    }
    report.depth = a.depth;
    if a.background > 0 {
        let (during, after) = background_gaps(&results, &background_tokens);
        report.background_itl_prefill_ms = Some(percentiles(during));
        report.background_itl_after_ms = Some(percentiles(after));
    }
    debug_assert!(asked.is_some() || results.iter().all(|r| r.times.len() == a.gen_tokens));
    // The bound on decode: the weights a step reads, at the machine's read bandwidth, measured
    // once the model is gone (its memory freed, the peak RSS taken already).
    let (info, step_bytes, row_macs, threads) = (
        handle.model_info().clone(),
        handle.step_weight_bytes(),
        handle.prompt_row_macs(),
        handle.threads(),
    );
    drop(handle);
    drop(engine);
    let gbps = read_bandwidth_gbps(threads);
    let bound = gbps * 1e9 / step_bytes.1.max(1) as f64;
    report.read_gbps = Some(gbps);
    report.step_weight_mb = Some(step_bytes.0 as f64 / 1e6);
    report.step_file_mb = Some(step_bytes.1 as f64 / 1e6);
    report.decode_bound_tps = Some(bound);
    report.decode_of_bound = Some(report.decode_tps / a.streams as f64 / bound);
    // The bound on prefill: the layers' multiply-adds a prompt row takes, at the rate of the
    // byte products the CPU kernels are made of (on a GPU, not theirs to bound).
    if a.model.on_cpu() {
        if let Some(peak) = rill_engine::kernels::byte_product_peak(Isa::detect(), threads) {
            let bound = peak / row_macs.max(1) as f64;
            report.byte_gmacs = Some(peak / 1e9);
            report.prompt_row_mmacs = Some(row_macs as f64 / 1e6);
            report.prefill_bound_tps = Some(bound);
            report.prefill_of_bound = Some(report.prefill_tps / bound);
        }
    }
    print_report(&a, &info, &report)
}

/// The background answers' inter-token gaps (ms) that ended while the measured prompts went in
/// (from the first submission to the last first token), and those that ended after, until the
/// measured answers were done.
fn background_gaps(results: &[StreamResult], tokens: &[Vec<Instant>]) -> (Vec<f64>, Vec<f64>) {
    let (Some(from), Some(to), Some(end)) = (
        results.iter().map(|r| r.submitted).min(),
        results.iter().filter_map(StreamResult::first).max(),
        results.iter().filter_map(StreamResult::last).max(),
    ) else {
        return (Vec::new(), Vec::new());
    };
    let (mut during, mut after) = (Vec::new(), Vec::new());
    for at in tokens {
        for w in at.windows(2) {
            let gap = (w[1] - w[0]).as_secs_f64() * 1e3;
            if w[1] > from && w[1] <= to {
                during.push(gap);
            } else if w[1] > to && w[1] <= end {
                after.push(gap);
            }
        }
    }
    (during, after)
}

/// The machine's read bandwidth in GB/s: `threads` threads each summing its share of a 1 GiB
/// buffer, the best of three passes (the buffer's pages are written, so faulted in, first).
fn read_bandwidth_gbps(threads: usize) -> f64 {
    const BYTES: usize = 1 << 30;
    let buf = vec![1u64; BYTES / 8];
    let share = buf.len().div_ceil(threads.max(1));
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in buf.chunks(share) {
                s.spawn(move || {
                    std::hint::black_box(part.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                });
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    BYTES as f64 / best / 1e9
}

/// Follows one generation, timing its tokens.
fn measure(submitted: Instant, gen: rill_engine::Generation) -> Result<StreamResult> {
    let mut r = StreamResult {
        submitted,
        ttft_ms: 0.0,
        gaps_ms: Vec::new(),
        prefill_tps: 0.0,
        decode_tps: 0.0,
        reused_tokens: 0,
        text: String::new(),
        times: Vec::new(),
        usage: Usage::default(),
    };
    for ev in gen {
        match ev {
            Event::Token { text, .. } => {
                r.text.push_str(&text);
                let now = Instant::now();
                match r.last() {
                    None => r.ttft_ms = (now - submitted).as_secs_f64() * 1e3,
                    Some(prev) => r.gaps_ms.push((now - prev).as_secs_f64() * 1e3),
                }
                r.times.push(now);
            }
            Event::Done { timings, usage, .. } => {
                r.usage = usage;
                r.prefill_tps = timings.prefill_tps;
                r.decode_tps = timings.decode_tps;
                return Ok(r);
            }
            Event::Error { message } => bail!("{message}"),
            Event::Started { reused_tokens, .. } => r.reused_tokens = reused_tokens,
            Event::Queued { .. } | Event::Stats { .. } => {}
        }
    }
    bail!("the engine stopped during the benchmark")
}

/// A conversation turn after turn: each prompt holds the whole history, so without prefix
/// reuse the time to first token grows with it.
fn bench_turns(a: &BenchArgs, handle: &rill_engine::Handle, turns: usize) -> Result<()> {
    const QUESTIONS: [&str; 4] = [
        "Tell me about the rivers of France.",
        "Which of them is the longest?",
        "What cities does it pass through?",
        "Describe one of those cities.",
    ];
    let mut messages: Vec<rill_engine::Message> = Vec::new();
    let (mut ttft, mut reused, mut results) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..turns {
        messages.push(rill_engine::Message::user(QUESTIONS[t % QUESTIONS.len()]));
        let req = GenerateRequest {
            params: SamplingParams::greedy(),
            max_tokens: Some(a.gen_tokens),
            ignore_eos: true,
            ..GenerateRequest::chat(messages.clone())
        };
        let r = measure(Instant::now(), handle.generate(req)?)?;
        reused.push(r.reused_tokens);
        messages.push(rill_engine::Message::assistant(r.text.clone()));
        ttft.push(r.ttft_ms);
        results.push(r);
    }
    let prompt_tokens = handle.tokenize_prompt(&Prompt::Messages(messages))?.len();
    let report = Report {
        streams: 1,
        // One stream at a time: the mean over turns, not the sum.
        decode_tps: results.iter().map(|r| r.decode_tps).sum::<f64>() / results.len().max(1) as f64,
        aggregate_tps: 0.0,
        turn_ttft_ms: Some(ttft),
        turn_reused_tokens: Some(reused),
        ..Report::new(a, prompt_tokens, &results)
    };
    print_report(a, handle.model_info(), &report)
}

/// The sampling panel's preview: the first one runs the prompt through the model; the ones
/// that follow (a slider moving) reshape the kept logits.
fn bench_preview(
    a: &BenchArgs,
    handle: &rill_engine::Handle,
    base: &[u32],
    moves: usize,
) -> Result<()> {
    let prompt: Vec<u32> = base
        .iter()
        .cycle()
        .skip(31)
        .take(a.prompt_tokens)
        .copied()
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let preview = |temperature: f32| -> Result<f64> {
        let t = Instant::now();
        rt.block_on(handle.preview(rill_engine::PreviewRequest {
            prompt: Prompt::Tokens(prompt.clone()),
            params: SamplingParams {
                temperature,
                ..Default::default()
            },
            top: 12,
        }))?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    let first_ms = preview(0.8)?;
    let moved = (0..moves)
        .map(|i| preview(0.1 + (i % 30) as f32 * 0.05))
        .collect::<Result<Vec<_>>>()?;
    let moved = percentiles(moved);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "prompt_tokens": a.prompt_tokens,
                "first_preview_ms": first_ms,
                "slider_move_ms": moved,
            })
        );
    } else {
        println!("prompt       {} tokens", a.prompt_tokens);
        println!("first        {first_ms:.1} ms  (the prompt through the model)");
        println!(
            "slider move  p50 {:.2} ms  p95 {:.2} ms  ({moves} moves, kept logits)",
            moved.p50, moved.p95
        );
    }
    Ok(())
}
