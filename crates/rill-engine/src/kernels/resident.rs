//! Weights kept in memory: `mlock` on the memory a matrix's weights lie in (its panels, or its
//! rows in the model file's map), so that the system never swaps them out nor evicts them from
//! the page cache, and a decode step never waits on the disk (`--mlock`, as llama.cpp's). The
//! system may refuse: an unprivileged process may lock only `RLIMIT_MEMLOCK` bytes (`ulimit -l`,
//! often 8 MB); the caller then says so and runs on, unlocked.

use super::*;

/// A range of memory a matrix's weights lie in: its address and length in bytes. Only the
/// system calls below are given the address; nothing reads or writes through it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    pub at: *const u8,
    pub len: usize,
}

// SAFETY: a `Region` is an address range, never dereferenced here: `mlock` and `munlock` take
// it from any thread, so a model holding its locked regions may move between threads.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn of<T>(items: &[T]) -> Region {
        Region {
            at: items.as_ptr().cast(),
            len: std::mem::size_of_val(items),
        }
    }
}

/// Locks the pages of `region` in memory (`mlock`; they are read in first if they are not).
pub(crate) fn lock_pages(Region { at, len }: Region) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: `mlock` reads and writes no memory; it pins the pages of the range, which the
        // caller's weights occupy (memory of this process: a buffer it holds, or its map of
        // the model file). The kernel rounds the range out to whole pages.
        match unsafe { libc::mlock(at.cast(), len) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (at, len);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "locking memory is not supported on this system",
        ))
    }
}

/// Unlocks what [`lock_pages`] locked: before the memory is freed, so that pages an allocator
/// keeps for reuse do not stay locked.
pub(crate) fn unlock_pages(Region { at, len }: Region) {
    #[cfg(unix)]
    if len > 0 {
        // SAFETY: as `lock_pages`: no memory is read or written; the range is still ours.
        let _ = unsafe { libc::munlock(at.cast(), len) };
    }
    #[cfg(not(unix))]
    let _ = (at, len);
}

/// One of this process's memory figures in bytes: `field` (`VmLck`, `VmHWM`, `RssAnon`, …) of
/// `/proc/self/status`; `None` where there is no such file or field.
pub fn process_status_bytes(field: &str) -> Option<usize> {
    crate::system::proc_kb_field("/proc/self/status", field)
}

/// This process's locked memory in bytes (`VmLck`).
pub fn process_locked_bytes() -> Option<usize> {
    process_status_bytes("VmLck")
}

impl QLinear {
    /// The memory its weights lie in: its panels or blocks, or its rows in the file's map.
    pub(crate) fn regions(&self) -> Vec<Region> {
        match self.weights.held() {
            Held::Rows(rows) => rows.regions(),
            Held::Made(w) => vec![each_layout!(w, v => Region::of(v))],
        }
    }
}

impl FileRows {
    /// The memory its blocks lie in, stretch by stretch.
    pub(crate) fn regions(&self) -> Vec<Region> {
        each_file_format!(self, w => w
            .stretch_blocks()
            .into_iter()
            .map(Region::of)
            .collect())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn locked() -> usize {
        process_locked_bytes().unwrap()
    }

    /// A matrix's panels are locked and unlocked whole: the process's locked memory grows by
    /// at least their size, and comes back down. Where the system refuses (a small
    /// `ulimit -l` without the privilege to pass it), the error is the system's, and nothing
    /// stays locked.
    #[test]
    fn a_matrix_is_locked_and_unlocked_whole() {
        let (n_out, k) = (256, 1024);
        let w: Vec<f32> = (0..n_out * k)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let w = candle_core::Tensor::from_vec(w, (n_out, k), &candle_core::Device::Cpu).unwrap();
        let q = candle_core::quantized::QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let lin = QLinear::from_qtensor(&q, Isa::detect()).unwrap();
        let regions = lin.regions();
        let bytes: usize = regions.iter().map(|r| r.len).sum();
        assert!(bytes >= lin.file_bytes(), "{bytes} bytes in regions");
        let before = locked();
        let outcome: std::io::Result<()> = regions.iter().try_for_each(|&r| lock_pages(r));
        match outcome {
            Ok(()) => assert!(locked() >= before + bytes, "{} locked", locked()),
            Err(e) => {
                eprintln!("locking refused here ({e}): only the refusal is checked");
                assert!(e.raw_os_error().is_some());
            }
        }
        regions.iter().for_each(|&r| unlock_pages(r));
        assert_eq!(locked(), before);
    }
}
