//! The machine's peak rate of byte products, the arithmetic a prompt's matrix products are
//! made of: the kernels multiply 8-bit activations by weights of 4 to 8 bits, four bytes a
//! 32-bit lane (`vpdpbusd`), or in 16-bit pairs (AVX2's `vpmaddubsw`). `rill bench` reports
//! prefill against it, as it reports decode against the read bandwidth: how far the kernels
//! are from what the CPU can do at all.
//!
//! Each thread runs independent chains of the instruction (more chains than its latency
//! spans, so only its throughput counts) on values in registers, touching no memory.

use std::time::Instant;

use super::Isa;

/// Iterations of a probe's loop: 2²⁴ of eight instructions, about 40 ms a thread with
/// 512-bit `vpdpbusd` at 3.7 GHz, long enough that a thread started late or interrupted
/// once costs a few percent (the best of five runs is taken).
const ITERS: u64 = 1 << 24;

/// Independent chains per thread: more than `vpdpbusd`'s latency (4–5 cycles) × throughput
/// (1–2 a cycle) needs, and few enough to stay in registers.
const CHAINS: usize = 8;

/// Byte multiply-adds per second that `threads` threads reach with the products `isa`'s
/// kernels use (`vpdpbusd` on 512-bit registers for [`Isa::Avx512Vnni`], on 256-bit for
/// [`Isa::AvxVnni`], `vpmaddubsw` and a 16-bit add for [`Isa::Avx2`]), the best of five runs;
/// `None` where no probe is written (NEON, the scalar reference).
pub fn byte_product_peak(isa: Isa, threads: usize) -> Option<f64> {
    let probe: fn(u64) -> u64 = match isa.checked() {
        // SAFETY (the three): `checked` keeps an `Isa` only where the CPU reports its
        // instructions (AVX-512 F, BW and VNNI; AVX-VNNI; AVX2).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => |n| unsafe { x86::dpbusd_512(n) },
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => |n| unsafe { x86::dpbusd_256(n) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => |n| unsafe { x86::maddubs_256(n) },
        _ => return None,
    };
    let threads = threads.max(1);
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let macs: u64 = std::thread::scope(|s| {
            let runs: Vec<_> = (0..threads)
                .map(|_| s.spawn(move || probe(ITERS)))
                .collect();
            runs.into_iter().map(|r| r.join().unwrap_or(0)).sum()
        });
        best = best.max(macs as f64 / t.elapsed().as_secs_f64());
    }
    Some(best)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// `macs`, after the chains' lanes are summed and kept, so that none of them is dead code.
    fn done(macs: u64, lanes: &[i32]) -> u64 {
        std::hint::black_box(lanes.iter().fold(0i32, |a, &b| a.wrapping_add(b)));
        macs
    }

    /// `n` × [`CHAINS`] `vpdpbusd` on 512-bit registers: 64 byte products each. Returns the
    /// products done.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dpbusd_512(n: u64) -> u64 {
        let (u, s) = (
            std::hint::black_box(_mm512_set1_epi8(3)),
            std::hint::black_box(_mm512_set1_epi8(-5)),
        );
        let mut acc: [__m512i; CHAINS] = std::array::from_fn(|c| _mm512_set1_epi32(c as i32));
        for _ in 0..n {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, u, s);
            }
        }
        let lanes: Vec<i32> = acc.iter().map(|a| _mm512_reduce_add_epi32(*a)).collect();
        done(n * CHAINS as u64 * 64, &lanes)
    }

    /// `n` × [`CHAINS`] AVX-VNNI `vpdpbusd` on 256-bit registers (asm, its VEX form, as the
    /// kernels write it): 32 byte products each.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dpbusd_256(n: u64) -> u64 {
        let (u, s) = (
            std::hint::black_box(_mm256_set1_epi8(3)),
            std::hint::black_box(_mm256_set1_epi8(-5)),
        );
        let mut acc: [__m256i; CHAINS] = std::array::from_fn(|c| _mm256_set1_epi32(c as i32));
        for _ in 0..n {
            for a in acc.iter_mut() {
                std::arch::asm!(
                    "{{vex}} vpdpbusd {acc}, {u}, {s}",
                    acc = inout(ymm_reg) *a,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
        }
        done(n * CHAINS as u64 * 32, &lanes_256(&acc))
    }

    /// `n` × [`CHAINS`] `vpmaddubsw` each added in 16 bits, as the AVX2 panel kernels sum a
    /// block's products: 32 byte products each.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn maddubs_256(n: u64) -> u64 {
        let (u, s) = (
            std::hint::black_box(_mm256_set1_epi8(3)),
            std::hint::black_box(_mm256_set1_epi8(-5)),
        );
        let mut acc: [__m256i; CHAINS] = std::array::from_fn(|c| _mm256_set1_epi16(c as i16));
        for _ in 0..n {
            for a in acc.iter_mut() {
                // In asm: the product of two values that do not change would be taken once.
                std::arch::asm!(
                    "vpmaddubsw {t}, {u}, {s}",
                    "vpaddw {acc}, {acc}, {t}",
                    acc = inout(ymm_reg) *a,
                    u = in(ymm_reg) u,
                    s = in(ymm_reg) s,
                    t = out(ymm_reg) _,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
        }
        done(n * CHAINS as u64 * 32, &lanes_256(&acc))
    }

    /// Each chain's first 32-bit lane.
    #[target_feature(enable = "avx2")]
    unsafe fn lanes_256(acc: &[__m256i]) -> Vec<i32> {
        acc.iter().map(|a| _mm256_extract_epi32::<0>(*a)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every x86 instruction set with a probe measures a rate a CPU can have: at least a
    /// G multiply-add a second, and below what a thread could do at 6 GHz with four 512-bit
    /// products a cycle (a loop the compiler had shortened or dropped would be over it).
    #[test]
    fn the_peak_is_a_rate_a_cpu_can_have() {
        for isa in Isa::available() {
            let peak = byte_product_peak(isa, 1);
            match isa {
                Isa::Scalar | Isa::Neon => assert_eq!(peak, None, "{isa:?}"),
                _ => {
                    let peak = peak.unwrap_or_else(|| panic!("{isa:?} has a probe"));
                    assert!(peak > 1e9 && peak < 6e9 * 4.0 * 64.0, "{isa:?}: {peak:e}");
                }
            }
        }
    }
}
