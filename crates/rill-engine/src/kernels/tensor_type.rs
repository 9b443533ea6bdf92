//! A tensor's storage format as a GGUF file names it: one of candle's [`GgmlDType`]s, or a
//! format candle has no type for, which only Rill's kernels read (MXFP4, gpt-oss's experts).
//! The header reader (`gguf.rs`) turns ggml's type ids into these once; the rest of the
//! engine never sees a type id.

use candle_core::quantized::GgmlDType;

/// How a tensor's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    /// A format candle reads too.
    Ggml(GgmlDType),
    /// ggml's `GGML_TYPE_MXFP4` (type id 39): 32 E2M1 codes and one E8M0 scale per block
    /// (`mxfp4.rs`).
    Mxfp4,
}

impl TensorType {
    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            TensorType::Ggml(d) => d.block_size(),
            TensorType::Mxfp4 => super::QK,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            TensorType::Ggml(d) => d.type_size(),
            TensorType::Mxfp4 => std::mem::size_of::<super::BlockMxfp4>(),
        }
    }

    /// candle's type, for a format candle reads.
    pub fn ggml(self) -> Option<GgmlDType> {
        match self {
            TensorType::Ggml(d) => Some(d),
            TensorType::Mxfp4 => None,
        }
    }

    /// Its name for people and logs: candle's (`Q4K`, `F16`), or `MXFP4`.
    pub fn name(self) -> String {
        match self {
            TensorType::Ggml(d) => format!("{d:?}"),
            TensorType::Mxfp4 => "MXFP4".into(),
        }
    }
}

impl From<GgmlDType> for TensorType {
    fn from(d: GgmlDType) -> Self {
        TensorType::Ggml(d)
    }
}
