//! Which instruction set the kernels run on, chosen at run time from what the CPU has
//! (`RILL_KERNELS` caps it), and the dot products it dispatches.

use super::*;

/// AVX2 with FMA and F16C (every AVX2 CPU has the other two).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-VNNI (`vpdpbusd` on 256-bit registers, VEX-encoded), on top of AVX2. Read once: CPUID
/// leaves the virtual machine on every call.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx_vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx2() && is_x86_feature_detected!("avxvnni"))
}

/// AVX-512 with byte and word instructions and VNNI, on top of AVX2 (the detection also checks
/// that the OS saves the 512-bit registers).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// AVX-512's 256-bit forms (VL), which `Isa::Avx512Vnni` does not promise by itself: the
/// MXFP4 and Q4_0 file-row tiles take `vpdpbusd` on 256-bit registers where the CPU has them.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_vl() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512vl"))
}

/// The instruction set the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// ARM's Advanced SIMD: the byte dot products, bit-identical to the scalar reference.
    Neon,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// The same, with AVX-VNNI's one-instruction byte dot products (bit-identical to `Avx2`).
    AvxVnni,
    /// AVX-512 (F, BW, VNNI) for the panel kernels, sixteen weight rows per vector
    /// (bit-identical to `Avx2`); the rest runs as `AvxVnni`, or `Avx2` on a CPU without AVX-VNNI.
    Avx512Vnni,
}

impl Isa {
    /// The best this CPU has; `RILL_KERNELS=scalar`, `avx2` or `avx-vnni` caps it, for
    /// benchmarks. An `Isa` reaches SIMD code only through [`checked`](Self::checked).
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let cap = std::env::var("RILL_KERNELS").unwrap_or_default();
            let available = Self::available();
            let cap = match cap.as_str() {
                "scalar" => Some(Isa::Scalar),
                "avx2" => Some(Isa::Avx2),
                "avx-vnni" => Some(Isa::AvxVnni),
                _ => None,
            };
            match cap {
                Some(isa) if available.contains(&isa) => isa,
                _ => available.last().copied().unwrap_or(Isa::Scalar),
            }
        })
    }

    /// Every instruction set this CPU can run, the best last (for tests against the reference).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(Isa::Neon);
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            v.push(Isa::Avx2);
            if has_avx_vnni() {
                v.push(Isa::AvxVnni);
            }
            if has_avx512_vnni() {
                v.push(Isa::Avx512Vnni);
            }
        }
        v
    }

    /// Whether AVX2, FMA and F16C may be used (every x86 SIMD `Isa`).
    pub fn avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni)
    }

    /// Whether the 256-bit kernels may use AVX-VNNI's `vpdpbusd`.
    pub(crate) fn avx_vnni(self) -> bool {
        match self {
            Isa::AvxVnni => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => has_avx_vnni(),
            _ => false,
        }
    }

    /// `self` if this CPU runs it, else the scalar reference: every public entry point passes
    /// its `Isa` through here, so naming an instruction set the CPU lacks can never run it.
    pub fn checked(self) -> Isa {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        match AVAILABLE.get_or_init(Isa::available).contains(&self) {
            true => self,
            false => Isa::Scalar,
        }
    }

    pub fn dot_q4_1_q8_1(self, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        self.checked().dot_q4_1_q8_1_checked(x, y)
    }

    pub fn dot_q8_0_q8_0(self, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        self.checked().dot_q8_0_q8_0_checked(x, y)
    }

    /// [`dot_q4_1_q8_1`](Self::dot_q4_1_q8_1) for an `Isa` already [`checked`](Self::checked)
    /// (the matmuls check theirs once, when the matrix is made).
    pub(crate) fn dot_q4_1_q8_1_checked(self, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        assert_eq!(x.len(), y.len());
        match self {
            // SAFETY: `avx2()` ISAs are only ever chosen when the CPU reports AVX2, FMA and
            // F16C; `avx_vnni()` says whether it reports AVX-VNNI as well.
            #[cfg(target_arch = "x86_64")]
            _ if self.avx_vnni() => unsafe { avx2::dot_q4_1_q8_1::<true>(x, y) },
            #[cfg(target_arch = "x86_64")]
            _ if self.avx2() => unsafe { avx2::dot_q4_1_q8_1::<false>(x, y) },
            // SAFETY: `Neon` is only chosen when the CPU reports it.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { neon::dot_q4_1_q8_1(x, y) },
            _ => dot_q4_1_q8_1_scalar(x, y),
        }
    }

    /// Q4_0 as the file holds it, as [`dot_q4_1_q8_1_checked`](Self::dot_q4_1_q8_1_checked)
    /// (NEON: the scalar reference).
    pub(crate) fn dot_q4_0_q8_1_checked(self, x: &[BlockQ4_0], y: &[BlockQ8_1]) -> f32 {
        assert_eq!(x.len(), y.len());
        match self {
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            _ if self.avx_vnni() => unsafe { avx2::dot_q4_0_q8_1::<true>(x, y) },
            #[cfg(target_arch = "x86_64")]
            _ if self.avx2() => unsafe { avx2::dot_q4_0_q8_1::<false>(x, y) },
            _ => dot_q4_0_q8_1_scalar(x, y),
        }
    }

    /// As [`dot_q4_1_q8_1_checked`](Self::dot_q4_1_q8_1_checked).
    pub(crate) fn dot_q8_0_q8_0_checked(self, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        assert_eq!(x.len(), y.len());
        match self {
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            _ if self.avx_vnni() => unsafe { avx2::dot_q8_0_q8_0::<true>(x, y) },
            #[cfg(target_arch = "x86_64")]
            _ if self.avx2() => unsafe { avx2::dot_q8_0_q8_0::<false>(x, y) },
            // SAFETY: as above.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { neon::dot_q8_0_q8_0(x, y) },
            _ => dot_q8_0_q8_0_scalar(x, y),
        }
    }
}
