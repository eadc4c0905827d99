//! Cluster specs: the accelerator, how many sit in a node, and the links between them.
//!
//! Figures are vendor datasheet values (dense bf16 tensor-core peak without sparsity, HBM capacity
//! and bandwidth, NVLink per-direction bandwidth) and typical NCCL latencies; every preset cites
//! its source next to its numbers. Achieved efficiencies are the cost model's business, not the
//! spec's: a spec only says what the hardware is.

use serde::{Deserialize, Serialize};

use crate::error::{IrError, Result};

/// One accelerator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    /// Vendor peak dense bf16 FLOP/s (fp32 for the `cpu` preset).
    pub peak_flops: f64,
    /// Device memory in bytes.
    pub hbm_bytes: u64,
    /// Device memory bandwidth in bytes/s.
    pub hbm_bandwidth: f64,
}

/// A point-to-point link in the alpha-beta model: time = latency + bytes / bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Per-direction bandwidth per device, bytes/s.
    pub bandwidth: f64,
    /// Per-message latency, seconds.
    pub latency: f64,
}

/// A homogeneous cluster of nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    pub gpu: GpuSpec,
    pub gpus_per_node: u32,
    /// Inside a node (NVLink / NVSwitch).
    pub intra_node: LinkSpec,
    /// Between nodes (InfiniBand / RoCE), per GPU.
    pub inter_node: LinkSpec,
}

/// Names of the cluster presets.
pub const CLUSTER_PRESETS: [&str; 5] = ["h100-sxm", "h800", "h200", "a100-80g", "cpu"];

const GIB: u64 = 1 << 30;

/// The longest link latency a spec may give, in seconds.
pub const MAX_LATENCY_S: f64 = 60.0;

impl ClusterSpec {
    /// A preset by name.
    ///
    /// Sources: NVIDIA H100 datasheet (SXM5: 989.4 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s,
    /// NVLink 4 900 GB/s bidirectional = 450 GB/s per direction); H800 SXM5 is the H100 with
    /// NVLink cut to 400 GB/s bidirectional; H200 datasheet (141 GB HBM3e at 4.8 TB/s, same
    /// compute and NVLink as H100); A100 80GB SXM datasheet (312 TFLOP/s bf16, 2.039 TB/s,
    /// NVLink 3 600 GB/s bidirectional). Inter-node: one 400 Gb/s NDR InfiniBand NIC per GPU
    /// (50 GB/s) on Hopper systems (DGX H100 reference design), 200 Gb/s HDR (25 GB/s) on DGX
    /// A100. Latencies are typical NCCL small-message figures (~5 us in a node over NVSwitch,
    /// ~10 us across InfiniBand). `cpu` describes the 2-core, 24 GiB machines the CPU runtime
    /// runs on; `slimpack calibrate` replaces its curves with measured ones.
    pub fn preset(name: &str) -> Result<ClusterSpec> {
        let hopper_ib = LinkSpec {
            bandwidth: 50e9,
            latency: 10e-6,
        };
        let nvlink = |bandwidth: f64| LinkSpec {
            bandwidth,
            latency: 5e-6,
        };
        let gpu = |name: &str, peak_flops: f64, hbm_bytes: u64, hbm_bandwidth: f64| GpuSpec {
            name: name.to_string(),
            peak_flops,
            hbm_bytes,
            hbm_bandwidth,
        };
        let (gpu, gpus_per_node, intra_node, inter_node) = match name {
            "h100-sxm" => (
                gpu("H100-SXM5-80GB", 989.4e12, 80 * GIB, 3.35e12),
                8,
                nvlink(450e9),
                hopper_ib,
            ),
            "h800" => (
                gpu("H800-SXM5-80GB", 989.4e12, 80 * GIB, 3.35e12),
                8,
                nvlink(200e9),
                hopper_ib,
            ),
            "h200" => (
                gpu("H200-SXM5-141GB", 989.4e12, 141_000_000_000, 4.8e12),
                8,
                nvlink(450e9),
                hopper_ib,
            ),
            "a100-80g" => (
                gpu("A100-SXM4-80GB", 312e12, 80 * GIB, 2.039e12),
                8,
                nvlink(300e9),
                LinkSpec {
                    bandwidth: 25e9,
                    latency: 10e-6,
                },
            ),
            "cpu" => (
                // Two cores with AVX2 FMA: 2 x 2 x 8 fp32 lanes x 2 flops x ~3 GHz ~ 192 GFLOP/s.
                gpu("cpu-2core", 192e9, 24 * GIB, 20e9),
                2,
                LinkSpec {
                    bandwidth: 10e9,
                    latency: 2e-6,
                },
                LinkSpec {
                    bandwidth: 1e9,
                    latency: 50e-6,
                },
            ),
            _ => {
                return Err(IrError::UnknownPreset {
                    kind: "cluster",
                    name: name.to_string(),
                    valid: CLUSTER_PRESETS.join(", "),
                })
            }
        };
        Ok(ClusterSpec {
            name: name.to_string(),
            gpu,
            gpus_per_node,
            intra_node,
            inter_node,
        })
    }

    /// Checks the spec on its own: positive sizes, finite positive rates and latencies of at
    /// most [`MAX_LATENCY_S`].
    pub fn validate(&self) -> Result<()> {
        let what = format!("cluster '{}'", self.name);
        if self.gpus_per_node == 0 {
            return Err(IrError::spec(
                &what,
                "gpus_per_node must be positive, got 0",
            ));
        }
        if self.gpu.hbm_bytes == 0 {
            return Err(IrError::spec(
                &what,
                "gpu.hbm_bytes must be positive, got 0",
            ));
        }
        for (field, value) in [
            ("gpu.peak_flops", self.gpu.peak_flops),
            ("gpu.hbm_bandwidth", self.gpu.hbm_bandwidth),
            ("intra_node.bandwidth", self.intra_node.bandwidth),
            ("inter_node.bandwidth", self.inter_node.bandwidth),
        ] {
            // At least one (FLOP or byte) per second: slower rates make step times overflow.
            if !(value.is_finite() && value >= 1.0) {
                return Err(IrError::spec(
                    &what,
                    format!("{field} must be a number of at least 1 (per second), got {value:?}"),
                ));
            }
        }
        for (field, value) in [
            ("intra_node.latency", self.intra_node.latency),
            ("inter_node.latency", self.inter_node.latency),
        ] {
            // At most a minute (links take microseconds): a latency near f64's range made step
            // times sum to infinity and the report's ratios NaN.
            if !(value.is_finite() && (0.0..=MAX_LATENCY_S).contains(&value)) {
                return Err(IrError::spec(
                    &what,
                    format!(
                        "{field} must be a number of seconds from 0 to {MAX_LATENCY_S}, got {value:?}"
                    ),
                ));
            }
        }
        Ok(())
    }
}
