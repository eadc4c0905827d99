//! Achieved efficiency: how fast each kind of kernel runs, as a function of how many tokens it
//! gets — the curves that turn FLOPs and bytes into seconds.
//!
//! Contract: [`Throughput::rate`] returns the achieved FLOP/s (GEMM and attention kinds) or
//! bytes/s ([`OpKind::Elementwise`]) of one device for a kernel over `tokens` tokens. The
//! analytic curves are saturating, `e(n) = e_max · n / (n + n_half)`: a small pack cannot fill
//! the GPU or amortise reading the weights, a large one approaches a ceiling below the datasheet
//! peak. Every curve can be replaced, per op kind, by a measured table ([`super::Calibration`]).
//!
//! Sources of the analytic constants (per device kind, [`DeviceProfile`]):
//! - GEMM ceiling: Stas Bekman's "Maximum Achievable Matmul FLOPS" table (ml-engineering,
//!   `compute/accelerator/README.md`): H100 SXM 792 of 989 TFLOP/s (80.1%) and A100 SXM 268 of
//!   312 (85.9%) for the *best* shape found by search; real layer shapes run a few percent lower,
//!   hence 0.75 and 0.80.
//! - GEMM half-saturation: a roofline argument, not a fit. Each GEMM call streams its weights
//!   from HBM once however few tokens it multiplies; charging that time in series with the math
//!   gives exactly the saturating form with `n_half = e_max · peak / bw · (weight bytes per
//!   FLOP-per-token)`: forward reads the bf16 weights (2 B per 2 FLOPs per token); backward
//!   reads them for the input gradient and reads and writes the fp32 main gradient that the
//!   weight-gradient GEMM accumulates into (Megatron's `gradient_accumulation_fusion`): 2 + 8 B
//!   per 4 FLOPs per token. On an H100 that is ~221 tokens forward and ~553 backward.
//! - Attention: a fit of the saturating curve to the FlashAttention-3 paper (Shah et al. 2024,
//!   Figs. 5–6, H100 SXM5, bf16, head dim 128, 16K tokens per batch): causal forward 292, 423,
//!   521, 579, 602, 616 TFLOP/s at 512…16K gives `e_max` 0.65 (643 TFLOP/s) with `n_half` 600
//!   tokens; backward 316…561 TFLOP/s gives `e_max` 0.58. The paper's backward figure is
//!   non-causal; we give it the causal forward's half-saturation (the masked diagonal blocks cost
//!   the same share of short sequences in both directions). A100: FlashAttention-2 (Dao 2023)
//!   reaches ~70% of peak forward and ~60% backward on long sequences; same half-saturation.
//!   The curve's argument is the slice's query length: short queries give few query tiles (low
//!   occupancy) and, at prefix 0, short keys (few key tiles to amortise the diagonal block).
//! - Element-wise kernels (norms, RoPE, SwiGLU, residual adds, cross-entropy) are memory-bound:
//!   85% of the datasheet HBM bandwidth, typical of fused element-wise kernels (STREAM-style
//!   copies reach ~90% on H100/A100).
//! - Kernel overhead: ~3 µs per kernel in a stream without CUDA graphs — launch latency plus
//!   ramp-up and tail of a short kernel (NVIDIA developer blog, "Getting Started with CUDA
//!   Graphs", 2019, measures a few µs per short kernel).
//! - `cpu`: placeholders until `slimpack calibrate` measures this machine.

use serde::{Deserialize, Serialize};

use super::calibration::{Calibration, CalibrationTable};
use super::memory::MAIN_GRAD_BYTES;
use slimpack_ir::spec::{ClusterSpec, Dtype, GpuSpec};

/// The kinds of kernel whose achieved rate the model distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// Forward GEMMs (projections, MLP, output projection); rate in FLOP/s.
    GemmForward,
    /// Backward GEMMs (input and weight gradients); rate in FLOP/s.
    GemmBackward,
    /// Forward varlen attention (FlashAttention-style); rate in FLOP/s.
    AttentionForward,
    /// Backward varlen attention; rate in FLOP/s.
    AttentionBackward,
    /// Memory-bound element-wise kernels; rate in bytes/s.
    Elementwise,
}

impl OpKind {
    /// Every kind, in table order.
    pub const ALL: [OpKind; 5] = [
        OpKind::GemmForward,
        OpKind::GemmBackward,
        OpKind::AttentionForward,
        OpKind::AttentionBackward,
        OpKind::Elementwise,
    ];

    /// The kebab-case name used in calibration files.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::GemmForward => "gemm-forward",
            OpKind::GemmBackward => "gemm-backward",
            OpKind::AttentionForward => "attention-forward",
            OpKind::AttentionBackward => "attention-backward",
            OpKind::Elementwise => "elementwise",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// `e(n) = max_efficiency · n / (n + half_tokens)`, a fraction of the device's peak.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SaturatingCurve {
    /// The ceiling approached by large token counts.
    pub max_efficiency: f64,
    /// Tokens at which half the ceiling is reached.
    pub half_tokens: f64,
}

impl SaturatingCurve {
    /// Efficiency at `tokens` tokens.
    pub fn at(&self, tokens: f64) -> f64 {
        self.max_efficiency * tokens / (tokens + self.half_tokens)
    }
}

/// Families of devices that share analytic efficiency constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// H100 / H800 / H200 (sm_90).
    Hopper,
    /// A100 / A800 (sm_80).
    Ampere,
    /// The CPU runtime's machines.
    Cpu,
}

impl DeviceKind {
    /// The family of `gpu`, from its name; unknown accelerators get the Hopper constants, the
    /// most common training GPU at the time of writing.
    pub fn of(gpu: &GpuSpec) -> DeviceKind {
        let name = gpu.name.to_ascii_lowercase();
        if name.starts_with("cpu") {
            DeviceKind::Cpu
        } else if name.contains("a100") || name.contains("a800") {
            DeviceKind::Ampere
        } else {
            DeviceKind::Hopper
        }
    }
}

/// Analytic efficiency constants of one device kind (sources in the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub kind: DeviceKind,
    /// Ceiling of GEMM efficiency (fraction of peak FLOP/s).
    pub gemm_max_efficiency: f64,
    /// Forward attention efficiency vs query length.
    pub attention_forward: SaturatingCurve,
    /// Backward attention efficiency vs query length.
    pub attention_backward: SaturatingCurve,
    /// Achieved fraction of HBM bandwidth for element-wise kernels.
    pub hbm_efficiency: f64,
    /// Fixed cost of one kernel in a stream (launch, ramp-up, tail), seconds.
    pub kernel_overhead_s: f64,
}

/// FlashAttention-3 causal forward fit (H100, head dim 128): half-saturation query length.
const FA3_HALF_TOKENS: f64 = 600.0;

impl DeviceProfile {
    /// The analytic constants of `kind`.
    pub fn of(kind: DeviceKind) -> DeviceProfile {
        match kind {
            DeviceKind::Hopper => DeviceProfile {
                kind,
                gemm_max_efficiency: 0.75,
                attention_forward: SaturatingCurve {
                    max_efficiency: 0.65,
                    half_tokens: FA3_HALF_TOKENS,
                },
                attention_backward: SaturatingCurve {
                    max_efficiency: 0.58,
                    half_tokens: FA3_HALF_TOKENS,
                },
                hbm_efficiency: 0.85,
                kernel_overhead_s: 3e-6,
            },
            DeviceKind::Ampere => DeviceProfile {
                kind,
                gemm_max_efficiency: 0.80,
                attention_forward: SaturatingCurve {
                    max_efficiency: 0.70,
                    half_tokens: FA3_HALF_TOKENS,
                },
                attention_backward: SaturatingCurve {
                    max_efficiency: 0.60,
                    half_tokens: FA3_HALF_TOKENS,
                },
                hbm_efficiency: 0.85,
                kernel_overhead_s: 3e-6,
            },
            // Placeholders (a blocked fp32 GEMM on two AVX2 cores, scalar attention loops,
            // a function call plus thread hand-off per op) until a calibration file replaces
            // them.
            DeviceKind::Cpu => DeviceProfile {
                kind,
                gemm_max_efficiency: 0.5,
                attention_forward: SaturatingCurve {
                    max_efficiency: 0.25,
                    half_tokens: 32.0,
                },
                attention_backward: SaturatingCurve {
                    max_efficiency: 0.2,
                    half_tokens: 32.0,
                },
                hbm_efficiency: 0.6,
                kernel_overhead_s: 5e-6,
            },
        }
    }
}

/// Achieved rates of one device for one model dtype: analytic curves, replaced per op kind by
/// calibration tables where given.
#[derive(Debug, Clone, PartialEq)]
pub struct Throughput {
    peak_flops: f64,
    hbm_bandwidth: f64,
    profile: DeviceProfile,
    gemm_forward: SaturatingCurve,
    gemm_backward: SaturatingCurve,
    tables: [Option<CalibrationTable>; 5],
}

impl Throughput {
    /// The analytic model of `cluster`'s device running a model stored in `dtype`.
    pub fn analytic(cluster: &ClusterSpec, dtype: Dtype) -> Throughput {
        let profile = DeviceProfile::of(DeviceKind::of(&cluster.gpu));
        let ridge = cluster.gpu.peak_flops / cluster.gpu.hbm_bandwidth;
        let weight_bytes = dtype.bytes() as f64;
        let forward_bytes_per_flop = weight_bytes / 2.0;
        let backward_bytes_per_flop = (weight_bytes + 2.0 * MAIN_GRAD_BYTES as f64) / 4.0;
        let e_max = profile.gemm_max_efficiency;
        Throughput {
            peak_flops: cluster.gpu.peak_flops,
            hbm_bandwidth: cluster.gpu.hbm_bandwidth,
            profile,
            gemm_forward: SaturatingCurve {
                max_efficiency: e_max,
                half_tokens: e_max * ridge * forward_bytes_per_flop,
            },
            gemm_backward: SaturatingCurve {
                max_efficiency: e_max,
                half_tokens: e_max * ridge * backward_bytes_per_flop,
            },
            tables: Default::default(),
        }
    }

    /// This model with the tables of `calibration` replacing the matching analytic curves.
    pub fn calibrated(mut self, calibration: &Calibration) -> Throughput {
        for (op, table) in &calibration.tables {
            self.tables[op.index()] = Some(table.clone());
        }
        self
    }

    /// The analytic constants in use.
    pub fn profile(&self) -> &DeviceProfile {
        &self.profile
    }

    /// The analytic curve of a compute kind (`None` for [`OpKind::Elementwise`]).
    pub fn curve(&self, op: OpKind) -> Option<SaturatingCurve> {
        match op {
            OpKind::GemmForward => Some(self.gemm_forward),
            OpKind::GemmBackward => Some(self.gemm_backward),
            OpKind::AttentionForward => Some(self.profile.attention_forward),
            OpKind::AttentionBackward => Some(self.profile.attention_backward),
            OpKind::Elementwise => None,
        }
    }

    /// Whether `op` uses a measured table.
    pub fn is_calibrated(&self, op: OpKind) -> bool {
        self.tables[op.index()].is_some()
    }

    /// Achieved FLOP/s (bytes/s for [`OpKind::Elementwise`]) of a kernel over `tokens` tokens.
    pub fn rate(&self, op: OpKind, tokens: f64) -> f64 {
        if let Some(table) = &self.tables[op.index()] {
            return table.rate_at(tokens);
        }
        match self.curve(op) {
            Some(curve) => self.peak_flops * curve.at(tokens),
            None => self.hbm_bandwidth * self.profile.hbm_efficiency,
        }
    }

    /// The highest rate `op` reaches at any size: the analytic curve's ceiling, or a measured
    /// table's best point (its interpolation never exceeds its points). The simulator prices
    /// its ideal times with it, so that no kernel runs faster than its ideal.
    pub fn saturated_rate(&self, op: OpKind) -> f64 {
        if let Some(table) = &self.tables[op.index()] {
            return table.points().iter().fold(0.0, |best, p| p.rate.max(best));
        }
        match self.curve(op) {
            Some(curve) => self.peak_flops * curve.max_efficiency,
            None => self.hbm_bandwidth * self.profile.hbm_efficiency,
        }
    }

    /// The highest rate `op` reaches over `tokens` tokens or fewer: the analytic curves rise
    /// with the tokens; a measured table's interpolation between two points never leaves the
    /// range of their rates (below its first point it falls to zero, past its last it stays
    /// there), so its best below `tokens` is at a point below `tokens` or at `tokens` itself.
    /// A kernel over at most `tokens` tokens runs no faster (`cost::bound` relies on it).
    pub fn best_rate_up_to(&self, op: OpKind, tokens: f64) -> f64 {
        match &self.tables[op.index()] {
            Some(table) => table
                .points()
                .iter()
                .take_while(|point| point.tokens <= tokens)
                .fold(table.rate_at(tokens), |best, point| best.max(point.rate)),
            None => self.rate(op, tokens),
        }
    }

    /// Seconds to do `work` (FLOPs, or bytes for element-wise) in a kernel over `tokens` tokens.
    pub fn time(&self, op: OpKind, work: f64, tokens: f64) -> f64 {
        if work <= 0.0 {
            return 0.0;
        }
        work / self.rate(op, tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::calibration::CalibrationPoint;

    fn h100() -> Throughput {
        Throughput::analytic(&ClusterSpec::preset("h100-sxm").unwrap(), Dtype::Bf16)
    }

    #[test]
    fn device_kinds_from_preset_names() {
        let kind = |preset: &str| DeviceKind::of(&ClusterSpec::preset(preset).unwrap().gpu);
        assert_eq!(kind("h100-sxm"), DeviceKind::Hopper);
        assert_eq!(kind("h800"), DeviceKind::Hopper);
        assert_eq!(kind("h200"), DeviceKind::Hopper);
        assert_eq!(kind("a100-80g"), DeviceKind::Ampere);
        assert_eq!(kind("cpu"), DeviceKind::Cpu);
    }

    #[test]
    fn gemm_half_saturation_is_the_weight_streaming_roofline() {
        let throughput = h100();
        let ridge = 989.4e12 / 3.35e12;
        let forward = throughput.curve(OpKind::GemmForward).unwrap();
        let backward = throughput.curve(OpKind::GemmBackward).unwrap();
        assert!((forward.half_tokens - 0.75 * ridge).abs() < 1e-9);
        assert!((backward.half_tokens - 0.75 * ridge * 2.5).abs() < 1e-9);
        assert!(
            (forward.half_tokens - 221.5).abs() < 0.1,
            "{}",
            forward.half_tokens
        );
    }

    #[test]
    fn curves_saturate_below_their_ceiling() {
        let throughput = h100();
        for op in [
            OpKind::GemmForward,
            OpKind::AttentionForward,
            OpKind::AttentionBackward,
        ] {
            let curve = throughput.curve(op).unwrap();
            let (small, large) = (curve.at(128.0), curve.at(65536.0));
            assert!(small < 0.5 * large, "{op:?}");
            assert!(large < curve.max_efficiency && large > 0.98 * curve.max_efficiency);
            assert!((curve.at(curve.half_tokens) - curve.max_efficiency / 2.0).abs() < 1e-12);
        }
    }

    #[test]
    fn attention_fit_tracks_flashattention3() {
        // FA3 paper, causal forward, head dim 128, H100 SXM5 (TFLOP/s); within 6%.
        let throughput = h100();
        let measured = [
            (512.0, 292.0),
            (1024.0, 423.0),
            (2048.0, 521.0),
            (4096.0, 579.0),
        ];
        for (tokens, tflops) in measured {
            let model = throughput.rate(OpKind::AttentionForward, tokens) / 1e12;
            assert!(
                (model / tflops - 1.0).abs() < 0.06,
                "{tokens}: {model} vs {tflops}"
            );
        }
    }

    #[test]
    fn calibration_replaces_only_the_tables_it_has() {
        let mut calibration = Calibration::new("H100-SXM5-80GB");
        let points = vec![
            CalibrationPoint {
                tokens: 256.0,
                rate: 300e12,
            },
            CalibrationPoint {
                tokens: 4096.0,
                rate: 700e12,
            },
        ];
        calibration.insert(OpKind::GemmForward, CalibrationTable::new(points).unwrap());
        let analytic = h100();
        let calibrated = analytic.clone().calibrated(&calibration);
        assert!(calibrated.is_calibrated(OpKind::GemmForward));
        assert_eq!(calibrated.rate(OpKind::GemmForward, 4096.0), 700e12);
        assert_eq!(
            calibrated.rate(OpKind::AttentionForward, 4096.0),
            analytic.rate(OpKind::AttentionForward, 4096.0)
        );
        assert_eq!(calibrated.time(OpKind::GemmForward, 0.0, 0.0), 0.0);
    }
}
