//! Rows of a step given as embeddings rather than tokens ([`Injected`]): an image's rows from a
//! vision projector (`vision/`), which take the place of placeholder tokens in the prompt.
//! Their placeholders are looked up as token 0 (any id would do: the row is replaced), and a
//! run of them may attend to itself both ways, as llama.cpp decodes Gemma 3's images, and
//! Qwen-VL's take M-RoPE positions of their own (`positions.rs`). Where the model has
//! deepstack layers (Qwen3-VL), each row is wider: its embedding, then one row per such layer,
//! which the decoder adds after that layer.

use super::config::DecoderConfig;
use super::kv::KvCache;

use super::positions::Pos3;
use crate::error::{Error, Result};

/// Rows of one sequence's step that are not its tokens' embeddings.
#[derive(Clone, Copy, Debug)]
pub struct Injected<'a> {
    /// Which sequence of the batch, and the first of its step's rows they replace.
    pub seq: usize,
    pub at: usize,
    /// `count × hidden · (1 + deepstack)` values, row after row.
    pub rows: &'a [f32],
    /// Whether these rows attend to each other both ways (Gemma 3's images).
    pub both_ways: bool,
    /// The rows as a grid, `nx` a row: their M-RoPE positions where the model has sections
    /// (Qwen-VL).
    pub grid: (usize, usize),
}

/// Each injected row's place in the batch, with its values.
type Placed<'a> = Vec<(usize, &'a [f32])>;
/// Per sequence: runs of its step's rows (first, count) that attend to each other both ways.
type Runs = Vec<Vec<(usize, usize)>>;

/// Checks `injected` against the step (`spans`: each sequence's first row and count) and sets
/// their rows' ids to 0; returns each row's place in the batch with its values (`width`
/// each: the model's, times one more per deepstack layer), and each sequence's runs of rows
/// that attend both ways.
pub(super) fn place<'a>(
    injected: &[Injected<'a>],
    spans: &[(usize, usize)],
    width: usize,
    ids: &mut [u32],
) -> Result<(Placed<'a>, Runs)> {
    let mut rows = Vec::new();
    let mut both_ways = vec![Vec::new(); spans.len()];
    for inj in injected {
        let count = inj.rows.len() / width.max(1);
        let fits = spans
            .get(inj.seq)
            .is_some_and(|&(_, t)| inj.at + count <= t);
        if !fits || count == 0 || inj.rows.len() != count * width {
            return Err(Error::param(
                "image",
                format!(
                    "{} values at row {} do not make whole rows of {width} inside the step",
                    inj.rows.len(),
                    inj.at
                ),
            ));
        }
        let first = spans[inj.seq].0 + inj.at;
        ids[first..first + count].fill(0);
        for (i, row) in inj.rows.chunks_exact(width).enumerate() {
            rows.push((first + i, row));
        }
        if inj.both_ways {
            both_ways[inj.seq].push((inj.at, count));
        }
    }
    Ok((rows, both_ways))
}

/// Each row's M-RoPE positions, sequence by sequence, where the model lays images out so
/// (Qwen-VL: M-RoPE's sections, consecutive or interleaved) and the step or a cache holds one; the step's images are
/// recorded in their caches. `None`: every row's position is its slot.
pub(super) fn positions(
    cfg: &DecoderConfig,
    batch: &mut [(&[u32], &mut KvCache)],
    injected: &[Injected],
) -> Option<Vec<Vec<Pos3>>> {
    let sectioned = cfg.rope_sections.is_some();
    let any = !injected.is_empty() || batch.iter().any(|(_, c)| c.shifts.total() > 0);
    if !(sectioned && any) {
        return None;
    }
    let steps = batch.iter_mut().enumerate().map(|(si, (tokens, cache))| {
        let images: Vec<_> = injected
            .iter()
            .filter(|im| im.seq == si)
            .map(|im| (im.at, im.grid.0, im.grid.1))
            .collect();
        let len = cache.len();
        cache.shifts.step(len, tokens.len(), &images)
    });
    Some(steps.collect())
}
