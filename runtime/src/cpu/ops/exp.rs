//! A vectorisable `exp` for the softmaxes of attention and the loss.
//!
//! `f32::exp` is a scalar library call (several nanoseconds); attention computes one per
//! (query, key) pair and head, which made it the CPU backend's bottleneck. This is Cephes'
//! `expf` — Cody–Waite reduction `x = k·ln 2 + r`, `|r| ≤ ln 2 / 2`, a degree-6 polynomial for
//! `e^r`, and `2^k` built in the exponent bits — written without branches or calls so that the
//! compiler vectorises the loops over rows. Relative error below 2.5e-7 (a few ulps) on the
//! arguments softmaxes produce (`x ≤ 0` after subtracting the row maximum); arguments below
//! −87.3 give 0, as `f32::exp` underflows there too.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 in two parts, so that `k · LN2_HI` is exact for the `k` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds to an integer and leaves that integer in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
const UNDERFLOW: f32 = -87.336_55;
const OVERFLOW: f32 = 88.376_26;

/// `e^x`.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let clamped = x.clamp(UNDERFLOW, OVERFLOW);
    let shifted = clamped * LOG2_E + ROUNDER;
    let k = shifted - ROUNDER;
    let k_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    let r = clamped - k * LN2_HI - k * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let e_r = p * r * r + r + 1.0;
    let scale = f32::from_bits(k_bits.wrapping_add(127) << 23);
    let value = e_r * scale;
    if x < UNDERFLOW {
        0.0
    } else {
        value
    }
}

/// `values[i] = e^(values[i] − shift)` for every value.
pub(crate) fn exp_shifted(values: &mut [f32], shift: f32) {
    for value in values.iter_mut() {
        *value = exp(*value - shift);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_library_exp_to_a_few_ulps() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 10.0 {
            let (fast, exact) = (f64::from(exp(x)), f64::from(x).exp());
            worst = worst.max((fast - exact).abs() / exact);
            x += 0.000_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }
}
