//! The host forward pass's buffers (`host.rs`), kept between steps by the model: a step of a 1B
//! model would otherwise take fresh memory for every layer and fault its pages in.

use super::experts::ExpertSpace;

/// The host forward pass's buffers, grown to the largest step and reused by every layer.
#[derive(Default)]
pub(super) struct Workspace {
    /// Buffers not in use: a step takes them for its outputs and gives back its inputs.
    pub(super) spare: Vec<Vec<f32>>,
    /// A mixture of experts' buffers.
    pub(super) experts: ExpertSpace,
}
