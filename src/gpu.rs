//! What the CUDA backend (`slimpack_runtime::cuda`) needs from the rest of slimpack: the GPUs
//! to run on, and the kernels built for their architecture by codegen — PTX from LLVM's NVPTX
//! backend and codegen's kernel table, handed over as data because the runtime does not depend
//! on codegen. Without the `cuda` feature every function says the build has no CUDA backend.

use slimpack_runtime::cuda::{self, CudaError, GpuInfo, KernelSource};

/// The machine's GPUs, or why there are none (no driver, no device, or a build without the
/// `cuda` feature).
pub fn gpus() -> Result<Vec<GpuInfo>, CudaError> {
    cuda::gpus()
}

/// The kernels for `gpu`'s architecture: codegen's PTX (sm_90 for Hopper and later, sm_80 for
/// Ampere) and its kernel table.
#[cfg(feature = "cuda")]
pub fn kernel_source(gpu: &GpuInfo) -> Result<KernelSource, CudaError> {
    use slimpack_codegen::llvm::kernels::{Grid, ParamKind, KERNELS};
    use slimpack_codegen::llvm::ptx::{compile_ptx, GpuArch};
    use slimpack_runtime::cuda::{KernelGrid, KernelSignature, ParamKind as RuntimeKind};

    let arch = match gpu.compute_capability {
        (major, _) if major >= 9 => GpuArch::Sm90,
        (8, _) => GpuArch::Sm80,
        (major, minor) => {
            return Err(CudaError::Unsupported {
                what: format!(
                "{} (compute capability {major}.{minor}): slimpack emits PTX for sm_80 and later",
                gpu.name
            ),
            })
        }
    };
    let ptx = compile_ptx(arch).map_err(|e| CudaError::Api {
        api: "PTX code generation",
        message: e.to_string(),
    })?;
    let kernels = KERNELS
        .iter()
        .map(|spec| KernelSignature {
            name: spec.name.to_string(),
            params: spec
                .params
                .iter()
                .map(|param| {
                    let kind = match param.kind {
                        ParamKind::F32Ptr => RuntimeKind::F32Ptr,
                        ParamKind::I32Ptr => RuntimeKind::I32Ptr,
                        ParamKind::I64 => RuntimeKind::I64,
                        ParamKind::F32 => RuntimeKind::F32,
                    };
                    (param.name.to_string(), kind)
                })
                .collect(),
            grid: match spec.grid {
                Grid::BlockPerRow { rows } => KernelGrid::BlockPerRow {
                    rows: rows.to_string(),
                },
                Grid::GridStride { items } => KernelGrid::GridStride {
                    items: items.product_of.iter().map(|n| n.to_string()).collect(),
                    divisor: items.divisor,
                },
            },
        })
        .collect();
    Ok(KernelSource { ptx, kernels })
}

/// Without the `cuda` feature there is no GPU to build kernels for.
#[cfg(not(feature = "cuda"))]
pub fn kernel_source(_gpu: &GpuInfo) -> Result<KernelSource, CudaError> {
    Err(CudaError::NotCompiled)
}

/// The cluster preset of a GPU, by the name its driver reports (`NVIDIA H100 80GB HBM3` is
/// `h100-sxm`); `None` for a GPU no preset describes.
pub fn cluster_preset(gpu_name: &str) -> Option<&'static str> {
    let name = gpu_name.to_ascii_lowercase();
    [
        ("h200", "h200"),
        ("h800", "h800"),
        ("h100", "h100-sxm"),
        ("a100", "a100-80g"),
    ]
    .into_iter()
    .find(|(model, _)| name.contains(model))
    .map(|(_, preset)| preset)
}

/// The first GPU and the kernels for it: what `run`, `calibrate` and `validate` with
/// `--backend cuda` need before anything else (a machine without one fails here, in one line).
pub fn first_gpu() -> Result<(GpuInfo, KernelSource), CudaError> {
    let found = gpus()?;
    let gpu = found
        .into_iter()
        .next()
        .expect("gpus() returns at least one or an error");
    let source = kernel_source(&gpu)?;
    Ok((gpu, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names_map_to_their_cluster_presets() {
        assert_eq!(cluster_preset("NVIDIA H100 80GB HBM3"), Some("h100-sxm"));
        assert_eq!(cluster_preset("NVIDIA H200"), Some("h200"));
        assert_eq!(cluster_preset("NVIDIA A100-SXM4-80GB"), Some("a100-80g"));
        assert_eq!(cluster_preset("NVIDIA GeForce RTX 4090"), None);
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn every_kernel_the_runtime_launches_is_in_codegens_table_with_its_parameters() {
        let gpu = GpuInfo {
            ordinal: 0,
            name: "H100".to_string(),
            compute_capability: (9, 0),
            memory_bytes: 80 << 30,
        };
        let source = kernel_source(&gpu).unwrap();
        source.check().unwrap();
        // Every launcher passes its kernel's parameters as the table lists them.
        cuda::check_launchers(&source).unwrap();
        assert!(
            source.ptx.contains(".target sm_90"),
            "{}",
            &source.ptx[..200]
        );
        for name in cuda::REQUIRED_KERNELS {
            assert!(
                source.ptx.contains(&format!(".entry {name}(")),
                "{name} is not an entry point of the PTX"
            );
        }
    }
}
