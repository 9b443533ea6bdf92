//! What `rill bench` reports: the figures of a run ([`Report`]), as a table or one JSON
//! object.

use anyhow::Result;
use serde::Serialize;

use super::{aggregate_tps, anon_rss_mb, peak_rss_mb, together_tps, BenchArgs, StreamResult};

#[derive(Serialize)]
pub(super) struct Percentiles {
    pub(super) p50: f64,
    pub(super) p95: f64,
}

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) streams: usize,
    pub(super) background: usize,
    /// Positions in the cache before the measured prompt (`--depth`).
    pub(super) depth: usize,
    /// How the KV cache stores keys and values (`--kv-cache`).
    pub(super) kv_cache: &'static str,
    pub(super) prompt_tokens: usize,
    pub(super) gen_tokens: usize,
    pub(super) prefill_tps: f64,
    pub(super) decode_tps: f64,
    pub(super) ttft_ms: Percentiles,
    pub(super) itl_ms: Percentiles,
    pub(super) peak_rss_mb: f64,
    /// Of the resident set at the end, what is the process's own, not mapped file pages.
    pub(super) anon_rss_mb: f64,
    /// From the engine's start to its model loaded, tokenizer and weights (warm page cache
    /// when the file was read recently).
    pub(super) load_ms: f64,
    /// From the engine's start to the first token of a one-token prompt run right after
    /// loading: what a user waits for before a first answer starts.
    pub(super) first_token_ms: f64,
    /// The warm-up answer (16 prompt tokens, 4 answer tokens) right after that, until every
    /// matrix runs in its fastest layout: it includes making the panels of weights that were
    /// read in the file's map until then.
    pub(super) warmup_ms: f64,
    /// MB (10⁶ bytes, as `step_weight_mb`) of weights locked in memory (`--mlock`; fewer
    /// than the weights where the system refused part of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) locked_mb: Option<f64>,
    pub(super) per_stream_decode_tps: Vec<f64>,
    /// All streams' tokens over the wall time from the first token of any to the last of all.
    pub(super) aggregate_tps: f64,
    /// All streams' tokens over the window in which every one was decoding (from the last
    /// stream's first token to the first stream's last), as llama-batched-bench's S_TG counts
    /// a batch decoding together; 0 when the streams never decoded all at once.
    pub(super) together_tps: f64,
    /// The machine's read bandwidth, GB/s, with the engine's threads ([`read_bandwidth_gbps`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) read_gbps: Option<f64>,
    /// MB of weights a decode step reads (every matrix, the output included, as the engine
    /// holds them; not the embedding rows it looks up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) step_weight_mb: Option<f64>,
    /// The same matrices' MB in the file (less where the engine repacks a format).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) step_file_mb: Option<f64>,
    /// Decode steps per second the bandwidth allows reading the file's bytes:
    /// `read_gbps` ÷ `step_file_mb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) decode_bound_tps: Option<f64>,
    /// Each stream's decode speed as a fraction of that bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) decode_of_bound: Option<f64>,
    /// The CPU's rate of byte products (G multiply-adds a second) with the engine's threads,
    /// by the instruction its kernels use (`rill_engine::kernels::byte_product_peak`); absent
    /// on a GPU, or where no probe is written (NEON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) byte_gmacs: Option<f64>,
    /// Millions of multiply-adds a prompt row takes in the layers' matrices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prompt_row_mmacs: Option<f64>,
    /// Prompt rows per second that rate allows: `byte_gmacs` ÷ `prompt_row_mmacs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prefill_bound_tps: Option<f64>,
    /// `prefill_tps` as a fraction of that bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) prefill_of_bound: Option<f64>,
    /// With `--background`: the background answers' inter-token gaps while the measured
    /// prompts went in (from their submission to the last one's first token), and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) background_itl_prefill_ms: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) background_itl_after_ms: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) turn_ttft_ms: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) turn_reused_tokens: Option<Vec<usize>>,
    /// With `--lookup` or `--draft-model`: draft tokens proposed and accepted, over all
    /// measured streams.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) draft_proposed: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) draft_accepted: Option<usize>,
    /// Tokens each measured answer made (`--gen-tokens`, or fewer where a file's answer ended).
    pub(super) answer_tokens: Vec<usize>,
}

impl Report {
    /// The figures of `results`, streams measured side by side.
    pub(super) fn new(a: &BenchArgs, prompt_tokens: usize, results: &[StreamResult]) -> Report {
        let speculates = a.lookup || a.contrary || a.model.draft_model.is_some();
        Report {
            streams: a.streams,
            background: a.background,
            depth: 0,
            kv_cache: a.model.kv_cache.name(),
            prompt_tokens,
            gen_tokens: a.gen_tokens,
            prefill_tps: results.iter().map(|r| r.prefill_tps).sum::<f64>()
                / results.len().max(1) as f64,
            decode_tps: results.iter().map(|r| r.decode_tps).sum(),
            ttft_ms: percentiles(results.iter().map(|r| r.ttft_ms).collect()),
            itl_ms: percentiles(
                results
                    .iter()
                    .flat_map(|r| r.gaps_ms.iter().copied())
                    .collect(),
            ),
            peak_rss_mb: peak_rss_mb(),
            anon_rss_mb: anon_rss_mb(),
            load_ms: 0.0,
            first_token_ms: 0.0,
            warmup_ms: 0.0,
            locked_mb: None,
            per_stream_decode_tps: results.iter().map(|r| r.decode_tps).collect(),
            aggregate_tps: aggregate_tps(results),
            together_tps: together_tps(results),
            read_gbps: None,
            step_weight_mb: None,
            step_file_mb: None,
            decode_bound_tps: None,
            decode_of_bound: None,
            byte_gmacs: None,
            prompt_row_mmacs: None,
            prefill_bound_tps: None,
            prefill_of_bound: None,
            background_itl_prefill_ms: None,
            background_itl_after_ms: None,
            turn_ttft_ms: None,
            turn_reused_tokens: None,
            draft_proposed: speculates
                .then(|| results.iter().map(|r| r.usage.draft_proposed).sum()),
            draft_accepted: speculates
                .then(|| results.iter().map(|r| r.usage.draft_accepted).sum()),
            answer_tokens: results.iter().map(|r| r.times.len()).collect(),
        }
    }
}

pub(super) fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles { p50: 0.0, p95: 0.0 };
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Percentiles {
        p50: at(0.5),
        p95: at(0.95),
    }
}

/// The report as one JSON object (`--json`) or a table.
pub(super) fn print_report(
    a: &BenchArgs,
    m: &rill_engine::ModelInfo,
    report: &Report,
) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "model        {} ({}, {:.0} MB)",
            m.name,
            m.quantization,
            m.file_bytes as f64 / 1e6
        );
        println!(
            "streams      {} (+{} in the background)",
            report.streams, report.background
        );
        println!(
            "prefill      {:.1} tok/s  ({} prompt tokens after {} in the {} cache)",
            report.prefill_tps, report.prompt_tokens, report.depth, report.kv_cache
        );
        println!(
            "decode       {:.1} tok/s  ({} tokens per stream, summed over streams)",
            report.decode_tps,
            report.answer_tokens.iter().max().unwrap_or(&0)
        );
        if let (Some(p), Some(acc)) = (report.draft_proposed, report.draft_accepted) {
            println!("speculation  {acc} of {p} proposed tokens accepted");
        }
        if report.streams > 1 {
            println!(
                "together     {:.1} tok/s  (all streams' tokens while all were decoding; \
                 {:.1} from the first token to the last)",
                report.together_tps, report.aggregate_tps
            );
        }
        println!(
            "ttft         p50 {:.1} ms  p95 {:.1} ms",
            report.ttft_ms.p50, report.ttft_ms.p95
        );
        println!(
            "inter-token  p50 {:.1} ms  p95 {:.1} ms",
            report.itl_ms.p50, report.itl_ms.p95
        );
        if let (Some(d), Some(af)) = (
            &report.background_itl_prefill_ms,
            &report.background_itl_after_ms,
        ) {
            println!(
                "background   inter-token p50 {:.1} ms  p95 {:.1} ms while the prompt went in; \
                 p50 {:.1} ms  p95 {:.1} ms after",
                d.p50, d.p95, af.p50, af.p95
            );
        }
        println!(
            "peak rss     {:.0} MB (at the end {:.0} MB the process's own, the rest mapped file)",
            report.peak_rss_mb, report.anon_rss_mb
        );
        if let Some(mb) = report.locked_mb {
            println!("locked       {mb:.0} MB of weights in memory (--mlock)");
        }
        if report.load_ms > 0.0 {
            println!(
                "load         {:.0} ms (first token {:.0} ms, warm-up {:.0} ms)",
                report.load_ms, report.first_token_ms, report.warmup_ms
            );
        }
        if let (Some(gbps), Some(held), Some(file), Some(bound), Some(of)) = (
            report.read_gbps,
            report.step_weight_mb,
            report.step_file_mb,
            report.decode_bound_tps,
            report.decode_of_bound,
        ) {
            println!(
                "bandwidth    {gbps:.1} GB/s read; a step reads {held:.0} MB of weights \
                 ({file:.0} MB in the file): decode bound {bound:.1} tok/s, each stream at \
                 {:.0}% of it",
                of * 100.0
            );
        }
        if let (Some(peak), Some(macs), Some(bound), Some(of)) = (
            report.byte_gmacs,
            report.prompt_row_mmacs,
            report.prefill_bound_tps,
            report.prefill_of_bound,
        ) {
            println!(
                "compute      {peak:.0} G byte multiply-adds/s; a prompt row takes {macs:.0} M: \
                 prefill bound {bound:.0} tok/s, prefill at {:.0}% of it",
                of * 100.0
            );
        }
        if let Some(t) = &report.turn_ttft_ms {
            println!(
                "turn ttft    {}",
                t.iter()
                    .map(|x| format!("{x:.0} ms"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}
