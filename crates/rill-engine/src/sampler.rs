//! Sampling: from a row of logits to one token id.
//!
//! [`SamplingParams`] is what a user sets (the sliders, the CLI flags, the API fields); it is
//! checked once by [`SamplingParams::validate`], at the edge, and then trusted. A [`Sampler`]
//! owns the validated parameters and a seeded random generator for one sequence. The pipeline
//! runs in this order: penalties → temperature → top-k → top-p → min-p → draw. Temperature 0 is
//! greedy (the highest logit after penalties; the lowest id wins a tie, as in llama.cpp).
//! Parameters can be replaced between two tokens ([`Sampler::set_params`]): the next draw uses
//! them, which is what makes the sliders live.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// What the user controls. Defaults follow llama.cpp's (temperature 0.8, top-k 40, top-p 0.95,
/// min-p 0.05, no repetition penalty), which LM Studio and Ollama also use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens; `None` disables the filter.
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability adds up to `top_p`; 1 disables it.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 disables it.
    pub min_p: f32,
    /// Divide (or multiply, for negative logits) the logit of recent tokens; 1 disables it.
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt included) the three penalties look at.
    pub repeat_last_n: usize,
    /// OpenAI's presence penalty: subtracted once from every token seen in the window.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Same seed and settings give the same text; `None` picks a fresh seed.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: Some(40),
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with no penalties: the setting reference outputs are made with.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        }
    }

    /// Checks every field; the error names the field and its allowed range.
    pub fn validate(&self) -> Result<()> {
        let finite = |field: &'static str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(Error::param(
                    field,
                    format!("must be a finite number, got {v}"),
                ))
            }
        };
        finite("temperature", self.temperature)?;
        if self.temperature < 0.0 {
            return Err(Error::param(
                "temperature",
                format!("must be ≥ 0 (0 = greedy), got {}", self.temperature),
            ));
        }
        finite("top_p", self.top_p)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::param(
                "top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        if self.top_k == Some(0) {
            return Err(Error::param(
                "top_k",
                "must be ≥ 1 (top-k keeps the k most likely tokens)",
            ));
        }
        finite("min_p", self.min_p)?;
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::param(
                "min_p",
                format!("must be in [0, 1], got {}", self.min_p),
            ));
        }
        finite("repeat_penalty", self.repeat_penalty)?;
        if self.repeat_penalty <= 0.0 {
            return Err(Error::param(
                "repeat_penalty",
                format!("must be > 0 (1 = off), got {}", self.repeat_penalty),
            ));
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            finite(field, v)?;
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::param(field, format!("must be in [-2, 2], got {v}")));
            }
        }
        Ok(())
    }

    /// The settings as JSON, with the `f32` fields written as the user set them (0.05, not
    /// the 0.05000000074505806 a widening to `f64` would give).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_string(self)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default()
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One candidate for a drawn token: how likely the model made it, and how likely it was in
/// the distribution actually drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub id: u32,
    /// The model's own probability: softmax of the raw logits.
    pub raw: f32,
    /// Its probability after the sampling pipeline (penalties, temperature, top-k, top-p,
    /// min-p); 0 when the pipeline cut it. At temperature 0 the drawn token has 1.
    pub sampled: f32,
}

/// One token of a [`Distribution`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shaped {
    pub id: u32,
    /// The model's own probability.
    pub raw: f32,
    /// After penalties, temperature and top-k (0 when top-k cut it): what top-p and min-p see.
    pub softened: f32,
    /// After the whole pipeline, renormalised: what a draw would use (0 when cut).
    pub sampled: f32,
}

/// The next-token distribution under a set of sampling parameters, for drawing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// The likeliest tokens by raw probability, likeliest first.
    pub candidates: Vec<Shaped>,
    /// Tokens left after top-k (the whole vocabulary when it is off).
    pub after_top_k: usize,
    /// Tokens left after top-p: the nucleus.
    pub after_top_p: usize,
    /// The min-p floor on the softened probability (0 when min-p is off).
    pub min_p_floor: f32,
    /// Tokens a draw can pick from (1 when greedy).
    pub kept: usize,
}

/// A small, fast, seedable generator (SplitMix64). Ours rather than `rand`'s so that a seed
/// gives the same text across dependency upgrades.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: Option<u64>) -> Self {
        let seed = seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            nanos ^ (&nanos as *const u64 as u64).rotate_left(32)
        });
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The validated parameters of one sequence plus its random state.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Scratch space reused across tokens (one entry per vocabulary id).
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            rng: Rng::new(params.seed),
            params,
            candidates: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Replaces the parameters from the next token on. A new seed restarts the generator;
    /// an unchanged seed keeps its stream going.
    pub fn set_params(&mut self, params: SamplingParams) -> Result<()> {
        params.validate()?;
        if params.seed != self.params.seed {
            self.rng = Rng::new(params.seed);
        }
        self.params = params;
        Ok(())
    }

    /// Picks the next token. `logits` is modified (penalties, temperature); `history` is every
    /// token of the sequence so far, prompt included.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        self.penalise(logits, history)?;
        if self.params.is_greedy() {
            return Ok(argmax(logits));
        }
        self.soften(logits);
        self.cut();
        let cands = &self.candidates;
        let total: f32 = cands.iter().map(|c| c.1).sum();
        let mut target = self.rng.next_f64() as f32 * total;
        for c in cands.iter() {
            target -= c.1;
            if target < 0.0 {
                return Ok(c.0);
            }
        }
        // Rounding left a sliver of mass past the end: the last candidate takes it.
        Ok(cands[cands.len() - 1].0)
    }

    /// Checks the row and applies the repetition penalties.
    fn penalise(&self, logits: &mut [f32], history: &[u32]) -> Result<()> {
        if logits.is_empty() {
            return Err(Error::param("logits", "empty logits row"));
        }
        if logits.iter().any(|l| l.is_nan()) {
            return Err(Error::Candle(candle_core::Error::Msg(
                "the model produced NaN logits".into(),
            )));
        }
        if self.params.has_penalties() {
            apply_penalties(logits, history, &self.params);
        }
        Ok(())
    }

    /// Temperature, top-k and softmax: `candidates` holds the top-k survivors with their
    /// probabilities, likeliest first. Temperature comes first, so that top-p and min-p see
    /// the distribution that is drawn from.
    fn soften(&mut self, logits: &[f32]) {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l * inv_t)),
        );
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = p.top_k.filter(|&k| k < cands.len()) {
            cands.select_nth_unstable_by(k - 1, by_logit_desc);
            cands.truncate(k);
        }
        cands.sort_unstable_by(by_logit_desc);

        // Softmax over the survivors (the max is first).
        let max = cands[0].1;
        let mut sum = 0.0f32;
        for c in cands.iter_mut() {
            c.1 = (c.1 - max).exp();
            sum += c.1;
        }
        for c in cands.iter_mut() {
            c.1 /= sum;
        }
    }

    /// Top-p, then min-p, on the softened candidates. Returns how many survived top-p and the
    /// min-p floor (a probability of the softened distribution; 0 when min-p is off).
    fn cut(&mut self) -> (usize, f32) {
        let p = &self.params;
        let cands = &mut self.candidates;
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                cum += c.1;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep);
        }
        let after_top_p = cands.len();
        let mut floor = 0.0;
        if p.min_p > 0.0 {
            floor = p.min_p * cands[0].1;
            let keep = cands.iter().take_while(|c| c.1 >= floor).count().max(1);
            cands.truncate(keep);
        }
        (after_top_p, floor)
    }

    /// The next-token distribution under these parameters, without drawing: the `n` tokens
    /// the model finds likeliest with their raw probability, their probability after penalties,
    /// temperature and top-k, and after the whole pipeline; plus where top-p and min-p cut.
    /// For redrawing a chart as a slider moves; the random state is left untouched.
    pub fn distribution(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n: usize,
    ) -> Result<Distribution> {
        let raw = softmax(logits);
        let mut shaped = logits.to_vec();
        self.penalise(&mut shaped, history)?;
        let ids = top_ids(logits, n);
        let greedy = self.params.is_greedy();
        let (softened, sampled, after_top_k, after_top_p, min_p_floor, kept) = if greedy {
            let best = argmax(&shaped);
            let one = |id: u32| if id == best { 1.0 } else { 0.0 };
            let v: Vec<f32> = ids.iter().map(|&id| one(id)).collect();
            (v.clone(), v, 1, 1, 0.0, 1)
        } else {
            self.soften(&shaped);
            let after_top_k = self.candidates.len();
            let prob_in = |cands: &[(u32, f32)], id: u32| {
                cands.iter().find(|c| c.0 == id).map_or(0.0, |c| c.1)
            };
            let softened: Vec<f32> = ids
                .iter()
                .map(|&id| prob_in(&self.candidates, id))
                .collect();
            let (after_top_p, floor) = self.cut();
            let total: f32 = self.candidates.iter().map(|c| c.1).sum();
            let sampled = ids
                .iter()
                .map(|&id| prob_in(&self.candidates, id) / total)
                .collect();
            (
                softened,
                sampled,
                after_top_k,
                after_top_p,
                floor,
                self.candidates.len(),
            )
        };
        let candidates = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| Shaped {
                id,
                raw: raw[id as usize],
                softened: softened[i],
                sampled: sampled[i],
            })
            .collect();
        Ok(Distribution {
            candidates,
            after_top_k,
            after_top_p,
            min_p_floor,
            kept,
        })
    }
}

impl Sampler {
    /// [`sample`](Self::sample), and the `n` tokens the model found likeliest with their raw and
    /// sampled probabilities (the drawn token is added when it is not among them). Costs a copy
    /// of the logits row and a pass over it; `sample` alone costs nothing extra.
    pub fn sample_explained(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        n: usize,
    ) -> Result<(u32, Vec<Candidate>)> {
        let raw = softmax(logits);
        let mut ids = top_ids(logits, n);
        let drawn = self.sample(logits, history)?;
        let raw = |id: u32| raw[id as usize];
        if !ids.contains(&drawn) {
            ids.push(drawn);
        }
        // The distribution drawn from: one certain token when greedy, else the survivors the
        // sampler kept (their weights do not add up to 1 after the cuts: renormalise).
        let sampled = |id: u32| -> f32 {
            if self.params.is_greedy() {
                return if id == drawn { 1.0 } else { 0.0 };
            }
            let total: f32 = self.candidates.iter().map(|c| c.1).sum();
            self.candidates
                .iter()
                .find(|c| c.0 == id)
                .map_or(0.0, |c| c.1 / total)
        };
        let candidates = ids
            .into_iter()
            .map(|id| Candidate {
                id,
                raw: raw(id),
                sampled: sampled(id),
            })
            .collect();
        Ok((drawn, candidates))
    }
}

/// Softmax of a whole row.
fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= sum);
    p
}

/// The `n` highest logits' ids, highest first (lowest id on ties).
fn top_ids(logits: &[f32], n: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let n = n.clamp(1, ids.len().max(1));
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, by_logit);
        ids.truncate(n);
    }
    ids.sort_unstable_by(by_logit);
    ids
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn apply_penalties(logits: &mut [f32], history: &[u32], p: &SamplingParams) {
    let window = &history[history.len().saturating_sub(p.repeat_last_n)..];
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&tok, &n) in &counts {
        let Some(l) = logits.get_mut(tok as usize) else {
            continue;
        };
        // CTRL-style repetition penalty (as in llama.cpp and HF): shrink towards "less likely".
        if *l > 0.0 {
            *l /= p.repeat_penalty;
        } else {
            *l *= p.repeat_penalty;
        }
        *l -= p.presence_penalty + p.frequency_penalty * n as f32;
    }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
