//! [`Precision`]: the arithmetic of the CUDA backend's GEMMs.
//!
//! `fp32` (the default) runs every GEMM as cuBLAS SGEMM; it is what `--check-reference` is held
//! to (relative error <= 1e-4 against the CPU reference). `bf16` runs every GEMM as cuBLAS
//! `cublasGemmEx` with bf16 operands, fp32 accumulation (`CUBLAS_COMPUTE_32F`) and an fp32
//! result: each operand is rounded to bf16 (round to nearest even) into a temporary just before
//! its GEMM. The weights, gradients, AdamW moments and every other kernel stay fp32 (fp32
//! master weights), so only the GEMMs' inputs lose precision. bf16 GEMMs need compute
//! capability 8.0 (Ampere) or later.

use super::error::{CudaError, Result};
use super::GpuInfo;

/// The GEMMs' precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// fp32 operands and accumulation (SGEMM).
    #[default]
    Fp32,
    /// bf16 operands, fp32 accumulation and result (`cublasGemmEx`).
    Bf16,
}

impl Precision {
    /// The oldest compute capability with bf16 GEMMs in cuBLAS.
    pub const BF16_MIN_CAPABILITY: (u32, u32) = (8, 0);

    /// Its command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Fails in one line unless `gpu` can run this precision's GEMMs.
    pub fn check_supported(self, gpu: &GpuInfo) -> Result<()> {
        if self == Precision::Bf16 && gpu.compute_capability < Self::BF16_MIN_CAPABILITY {
            let ((major, minor), (need_major, need_minor)) =
                (gpu.compute_capability, Self::BF16_MIN_CAPABILITY);
            return Err(CudaError::Unsupported {
                what: format!(
                    "bf16 GEMMs on GPU {} ({}, compute capability {major}.{minor}; they need {need_major}.{need_minor} or later): use --precision fp32",
                    gpu.ordinal, gpu.name
                ),
            });
        }
        Ok(())
    }
}

/// The bf16 value nearest `x` (ties to even; a NaN stays a quiet NaN), as its 16 bits: the
/// rounding the device's conversion kernel (`kernels.rs`, `slimpack_f32_to_bf16`) applies, in
/// the same integer steps.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1));
    (rounded >> 16) as u16
}

/// Values a GEMM operand spans in memory: `rows × cols` stored row-major with row stride `ld`
/// (the stored layout's rows and columns, before any transposition). The last row ends at its
/// last column, so a column block of a wider tensor converts no value past the tensor's end.
pub fn operand_extent(stored_rows: usize, stored_cols: usize, ld: usize) -> usize {
    match stored_rows {
        0 => 0,
        rows => (rows - 1) * ld + stored_cols,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(compute_capability: (u32, u32)) -> GpuInfo {
        GpuInfo {
            ordinal: 0,
            name: "test GPU".to_string(),
            compute_capability,
            memory_bytes: 1 << 30,
        }
    }

    #[test]
    fn bf16_needs_compute_capability_8_0() {
        for old in [(7, 5), (7, 0), (6, 1)] {
            let error = Precision::Bf16.check_supported(&gpu(old)).unwrap_err();
            let line = error.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains("need 8.0 or later"), "{line}");
            assert!(line.contains(&format!("{}.{}", old.0, old.1)), "{line}");
        }
        for new in [(8, 0), (8, 6), (9, 0), (10, 0)] {
            Precision::Bf16.check_supported(&gpu(new)).unwrap();
        }
        Precision::Fp32.check_supported(&gpu((6, 1))).unwrap();
    }

    #[test]
    fn bf16_rounding_is_to_nearest_even() {
        let bf16 = |bits: u16| f32::from_bits(u32::from(bits) << 16);
        // Exactly representable values are unchanged.
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            0.15625,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(bf16(f32_to_bf16_bits(x)).to_bits(), x.to_bits(), "{x}");
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
        assert_eq!(bf16(f32_to_bf16_bits(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(
            bf16(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        // Above halfway rounds up, below rounds down.
        assert_eq!(
            bf16(f32_to_bf16_bits(1.0 + 2f32.powi(-8) + 2f32.powi(-20))),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(bf16(f32_to_bf16_bits(1.0 + 2f32.powi(-9))), 1.0);
        // The relative error of rounding is at most half a unit in the last place, 2^-8.
        for i in 1..2000 {
            let x = (i as f32 * 0.73).sin() * 100.0 + 0.001;
            let err = ((bf16(f32_to_bf16_bits(x)) - x) / x).abs();
            assert!(err <= 2f32.powi(-8), "{x}: {err}");
        }
        assert!(bf16(f32_to_bf16_bits(f32::NAN)).is_nan());
        // The largest finite values round to infinity only past bf16's range.
        assert_eq!(bf16(f32_to_bf16_bits(f32::MAX)), f32::INFINITY);
    }

    #[test]
    fn operand_extent_stops_at_the_last_column() {
        assert_eq!(operand_extent(4, 8, 8), 32);
        // One head (16 columns) of a [4, 64] tensor: 3 full strides and one head's width.
        assert_eq!(operand_extent(4, 16, 64), 3 * 64 + 16);
        assert_eq!(operand_extent(0, 16, 64), 0);
    }
}
