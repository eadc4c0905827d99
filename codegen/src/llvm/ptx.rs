//! PTX for the kernels of [`super::kernels`], offline, through LLVM 22's NVPTX backend: no CUDA
//! toolkit. One PTX module per GPU architecture.
//!
//! Contract: [`compile_ptx`] builds the kernels into a fresh module, checks it with LLVM's
//! verifier, optimises it (`default<O3>`, which also promotes the kernels' loop variables to
//! registers) and prints PTX assembly for `nvptx64-nvidia-cuda` at the requested `sm_XX`.

use inkwell::context::Context;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::OptimizationLevel;

use super::kernels;
use crate::CodegenError;

/// The GPU architectures slimpack emits PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuArch {
    /// Ampere (A100).
    Sm80,
    /// Hopper (H100, H200, H800).
    Sm90,
}

impl GpuArch {
    pub const ALL: [GpuArch; 2] = [GpuArch::Sm80, GpuArch::Sm90];

    /// The architecture of a cluster's GPU, by its name: Ampere (A100) is sm_80, every other
    /// preset (Hopper: H100, H200, H800) sm_90.
    pub fn for_gpu(gpu_name: &str) -> GpuArch {
        if gpu_name.to_ascii_lowercase().contains("a100") {
            GpuArch::Sm80
        } else {
            GpuArch::Sm90
        }
    }

    /// The name LLVM and ptxas use (`sm_80`).
    pub fn name(self) -> &'static str {
        match self {
            GpuArch::Sm80 => "sm_80",
            GpuArch::Sm90 => "sm_90",
        }
    }
}

const NVPTX_TRIPLE: &str = "nvptx64-nvidia-cuda";

fn llvm_error(stage: &'static str, message: impl ToString) -> CodegenError {
    CodegenError::Llvm {
        stage,
        message: message.to_string(),
    }
}

fn nvptx_machine(arch: GpuArch) -> Result<TargetMachine, CodegenError> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create(NVPTX_TRIPLE);
    let target = Target::from_triple(&triple).map_err(|e| llvm_error("nvptx target", e))?;
    target
        .create_target_machine(
            &triple,
            arch.name(),
            "",
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            llvm_error(
                "nvptx target",
                format!("no target machine for {}", arch.name()),
            )
        })
}

/// The kernels' PTX assembly for `arch`.
pub fn compile_ptx(arch: GpuArch) -> Result<String, CodegenError> {
    let machine = nvptx_machine(arch)?;
    let context = Context::create();
    let module = context.create_module("slimpack_kernels");
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    kernels::build_all(&context, &module, kernels::Target::Nvptx)?;
    module
        .verify()
        .map_err(|e| llvm_error("kernel verification", e))?;
    module
        .run_passes("default<O3>", &machine, PassBuilderOptions::create())
        .map_err(|e| llvm_error("kernel optimisation", e))?;
    let buffer = machine
        .write_to_memory_buffer(&module, FileType::Assembly)
        .map_err(|e| llvm_error("ptx emission", e))?;
    String::from_utf8(buffer.as_slice().to_vec()).map_err(|e| llvm_error("ptx emission", e))
}
