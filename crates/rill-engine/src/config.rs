//! How to start an engine ([`EngineConfig`]): the model, the device, threads, context and
//! cache sizes, speculation, and whether the weights are locked in memory; and the defaults
//! the engine takes for what a config leaves open.

use std::path::PathBuf;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::model::KvType;

/// Where the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    /// Needs the `cuda` cargo feature.
    Cuda,
    /// Needs the `metal` cargo feature.
    Metal,
}

impl DeviceKind {
    pub(crate) fn device(self) -> Result<Device> {
        Ok(match self {
            DeviceKind::Cpu => Device::Cpu,
            DeviceKind::Cuda => Device::new_cuda(0)?,
            DeviceKind::Metal => Device::new_metal(0)?,
        })
    }
}

/// How to start an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub device: DeviceKind,
    /// Compute threads; `None` = one per physical core. The engine's own pool: every forward
    /// pass runs inside it (no process-wide setting is changed, so engines of one process can
    /// differ).
    pub threads: Option<usize>,
    /// Cap on the context window (positions per sequence); `None` = the model's, at most 8192.
    pub context_size: Option<usize>,
    /// Prompt tokens per prefill step, so a long prompt never freezes other answers.
    pub prefill_chunk: usize,
    /// Bytes of KV cache all sequences (and kept prefixes) may hold; `None` = a quarter of the
    /// available memory, at least one full context. New requests wait when it is full.
    pub kv_budget: Option<usize>,
    /// How the KV caches store keys and values: f16, or 8-bit (`q8_0`, CPU only), which takes
    /// 53% of the memory, so twice the context fits the same budget.
    pub kv_cache: KvType,
    /// A smaller model of the same vocabulary to propose tokens for answers that ask for
    /// [`Speculation::Draft`](crate::Speculation::Draft) (`draft.rs`); it can be changed
    /// later with [`Handle::set_draft_model`](crate::Handle::set_draft_model).
    pub draft_model: Option<PathBuf>,
    /// Weigh what speculation costs, pass by pass (`weigh.rs`): drafts pause where they lower
    /// the machine's throughput or slow an answer that does not speculate. On by default;
    /// tests of the checking path turn it off, so that drafts are checked whatever this
    /// machine's speed.
    pub weigh_speculation: bool,
    /// Keep the weights in memory (`mlock`, as llama.cpp's `--mlock`): the system never swaps
    /// them out nor drops them from the page cache. Loading then reads them all (and makes
    /// every panel) before the first answer. Where the system refuses (a small `ulimit -l`), a
    /// warning says how much was locked and the model runs on
    /// ([`Handle::locked_weight_bytes`](crate::Handle::locked_weight_bytes)).
    pub lock_weights: bool,
    /// The vision projector (`mmproj-*.gguf`) that lets the model read images; `None` takes
    /// the one beside the model file, if there is one (`vision::beside`). One given here that
    /// cannot be read or belongs to another model is an error; one found beside it is then
    /// left aside with a warning.
    pub projector: Option<PathBuf>,
}

impl EngineConfig {
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model: model.into(),
            device: DeviceKind::Cpu,
            threads: None,
            context_size: None,
            prefill_chunk: 256,
            kv_budget: None,
            kv_cache: KvType::F16,
            draft_model: None,
            weigh_speculation: true,
            lock_weights: false,
            projector: None,
        }
    }
}

/// Default context cap: enough for long chats, small enough that a 128k-context model does not
/// reserve gigabytes of RoPE tables and cache by default.
pub(crate) const DEFAULT_CONTEXT_CAP: usize = 8192;
