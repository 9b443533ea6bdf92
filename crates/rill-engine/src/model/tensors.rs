//! Where a model's tensors come from: a memory map of the file (on Unix), or the file read.
//! A tensor is handed out as it lies in the file ([`RawTensor`]: format, shape, bytes), so our
//! kernels make their panels straight from the mapped bytes, and only what candle runs
//! becomes a candle tensor (one copy more).

use std::borrow::Cow;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::Device;

use crate::gguf::Header;
use crate::kernels::TensorType;

/// Where the weights' bytes come from: a map of the whole file, or the file read.
pub(crate) enum TensorSource<'a, R> {
    Mapped(&'a Arc<memmap2::Mmap>),
    Read(&'a mut R),
}

/// One tensor as the file holds it. Borrowed from a map, its pages leave the map when it is
/// dropped (they stay in the page cache), so the map never adds a file's worth to the RSS.
pub(crate) struct RawTensor<'a> {
    pub(crate) dtype: TensorType,
    pub(crate) dims: Vec<usize>,
    pub(crate) bytes: Cow<'a, [u8]>,
    device: Device,
    /// The map and the tensor's offset in it, when borrowed from one.
    mapped: Option<(&'a Arc<memmap2::Mmap>, usize)>,
    /// One expert's slab of a mixture ([`split`](Self::split)): read where it lies in the map
    /// in every format our row kernels take, so a mixture's file is not copied.
    pub(crate) expert: bool,
}

impl RawTensor<'_> {
    /// The map the bytes lie in, and their offset there, when they come from one: a format
    /// our kernels run as the file holds it reads them there (`kernels/mapped.rs`).
    pub(crate) fn map(&self) -> Option<(&Arc<memmap2::Mmap>, usize)> {
        self.mapped
    }

    /// As a candle tensor on the model's device (a copy of the bytes); refused for a format
    /// only our kernels read (MXFP4).
    pub(crate) fn qtensor(&self) -> candle_core::Result<QTensor> {
        let Some(dtype) = self.dtype.ggml() else {
            candle_core::bail!(
                "{} runs on Rill's CPU kernels only, not on candle's (a GPU)",
                self.dtype.name()
            )
        };
        candle_core::quantized::ggml_file::qtensor_from_ggml(
            dtype,
            &self.bytes,
            self.dims.clone(),
            &self.device,
        )
    }
}

impl<'a> RawTensor<'a> {
    /// A tensor of `n` equal slabs along its first dimension (a mixture's experts, `[n, rows,
    /// cols]`) as `n` tensors of the rest of its shape, each its own bytes of the file: an
    /// expert's matrix is contiguous, its rows in blocks as a 2-D tensor's are. `None` where
    /// the first dimension is not `n` or a slab is not whole bytes.
    pub(crate) fn split(mut self, n: usize) -> Option<Vec<RawTensor<'a>>> {
        if self.dims.first() != Some(&n) || n == 0 || !self.bytes.len().is_multiple_of(n) {
            return None;
        }
        let dims = self.dims[1..].to_vec();
        let size = self.bytes.len() / n;
        // The slabs take over the map's pages: each drops its own range when it is dropped.
        let mapped = self.mapped.take();
        let bytes = std::mem::replace(&mut self.bytes, Cow::Borrowed(&[]));
        let part = |i: usize| -> Cow<'a, [u8]> {
            match &bytes {
                Cow::Borrowed(b) => Cow::Borrowed(&b[i * size..(i + 1) * size]),
                Cow::Owned(b) => Cow::Owned(b[i * size..(i + 1) * size].to_vec()),
            }
        };
        Some(
            (0..n)
                .map(|i| RawTensor {
                    dtype: self.dtype,
                    dims: dims.clone(),
                    bytes: part(i),
                    device: self.device.clone(),
                    mapped: mapped.map(|(map, at)| (map, at + i * size)),
                    expert: true,
                })
                .collect(),
        )
    }
}

impl Drop for RawTensor<'_> {
    fn drop(&mut self) {
        // The bytes borrowed from the map end with this value.
        if let Some((map, at)) = self.mapped {
            crate::kernels::drop_pages(map, at, self.bytes.len());
        }
    }
}

/// Tensor `name` of `ct`, with candle's checks (`TensorInfo::read`): its size from its shape
/// and format, and its bytes inside the file.
pub(crate) fn raw_tensor<'a, R: Read + Seek>(
    ct: &Header,
    source: &mut TensorSource<'a, R>,
    name: &str,
    device: &Device,
) -> candle_core::Result<RawTensor<'a>> {
    let Some(info) = ct.tensor_infos.get(name) else {
        candle_core::bail!("cannot find tensor info for {name}")
    };
    let (elems, block) = (info.shape.elem_count(), info.dtype.block_size());
    if !elems.is_multiple_of(block) {
        candle_core::bail!(
            "the number of elements {elems} is not divisible by the block size {block}"
        )
    }
    let size = elems / block * info.dtype.type_size();
    let start = ct.tensor_data_offset.saturating_add(info.offset);
    let beyond = || {
        candle_core::Error::Msg(format!(
            "tensor needs {size} bytes at offset {start}, beyond the end of the file"
        ))
    };
    let (bytes, mapped) = match source {
        TensorSource::Mapped(map) => {
            let map: &'a Arc<memmap2::Mmap> = map;
            let at = usize::try_from(start)
                .ok()
                .filter(|&at| at.checked_add(size).is_some_and(|end| end <= map.len()))
                .ok_or_else(beyond)?;
            (Cow::Borrowed(&map[at..at + size]), Some((map, at)))
        }
        TensorSource::Read(reader) => {
            let len = reader.seek(SeekFrom::End(0))?;
            if (size as u64) > len.saturating_sub(start) {
                return Err(beyond());
            }
            let mut bytes = vec![0u8; size];
            reader.seek(SeekFrom::Start(start))?;
            reader.read_exact(&mut bytes)?;
            (Cow::Owned(bytes), None)
        }
    };
    Ok(RawTensor {
        dtype: info.dtype,
        dims: info.shape.dims().to_vec(),
        bytes,
        device: device.clone(),
        mapped,
        expert: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A family's test model (`scripts/make-test-models.py`, which `make test` runs).
    fn test_model(name: &str) -> std::path::PathBuf {
        let dir = std::env::var_os("RILL_TEST_MODELS").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/test-models"),
            Into::into,
        );
        dir.join(format!("{name}.gguf"))
    }

    /// Every tensor of a file whose formats are mixed (Q4_K, Q6_K, Q5_0, F32) comes out of the
    /// map as the file read gives it, and one said to lie past the end is refused by both.
    #[test]
    fn mapped_and_read_tensors_are_the_same_bytes() {
        let path = test_model("qwen2-test.Q4_K_M");
        let mut file = std::fs::File::open(&path).expect("run scripts/make-test-models.py");
        let len = file.metadata().unwrap().len();
        let mut ct = crate::model::gguf::read(&mut file, len).unwrap();
        // SAFETY: a test's own file, only read.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.unwrap());
        let names: Vec<String> = ct.tensor_infos.keys().cloned().collect();
        let mut dtypes = std::collections::BTreeSet::new();
        for name in &names {
            let a = raw_tensor(
                &ct,
                &mut TensorSource::<std::fs::File>::Mapped(&map),
                name,
                &Device::Cpu,
            )
            .unwrap();
            let b =
                raw_tensor(&ct, &mut TensorSource::Read(&mut file), name, &Device::Cpu).unwrap();
            assert_eq!((a.dtype, &a.dims), (b.dtype, &b.dims), "{name}");
            assert!(a.bytes == b.bytes, "{name}");
            assert!(matches!(a.bytes, Cow::Borrowed(_)) && a.mapped.is_some());
            dtypes.insert(format!("{:?}", a.dtype));
        }
        assert!(dtypes.len() >= 3, "{dtypes:?}");
        let name = &names[0];
        ct.tensor_infos.get_mut(name).unwrap().offset = map.len() as u64;
        let mapped = raw_tensor(
            &ct,
            &mut TensorSource::<std::fs::File>::Mapped(&map),
            name,
            &Device::Cpu,
        );
        let read = raw_tensor(&ct, &mut TensorSource::Read(&mut file), name, &Device::Cpu);
        for e in [mapped.err(), read.err()] {
            let e = e.expect("refused").to_string();
            assert!(e.contains("beyond the end of the file"), "{e}");
        }
    }
}
