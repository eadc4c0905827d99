//! The PTX kernels: every kernel is a `.visible .entry` of the PTX for each architecture, the
//! PTX targets that architecture, and the kernels are real code (reductions shuffle and
//! synchronise, transcendental ops use the PTX approximations).
#![cfg(feature = "llvm")]

mod common;

use slimpack_codegen::llvm::kernels::KERNELS;
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
        let mut previous = 0;
        for kernel in KERNELS {
            let entry = format!(".visible .entry {}(", kernel.name);
            let at = ptx
                .find(&entry)
                .unwrap_or_else(|| panic!("{} missing from the {} PTX", kernel.name, arch.name()));
            assert!(at >= previous, "{} out of the table's order", kernel.name);
            previous = at;
            let declared = ptx[at..]
                .split(')')
                .next()
                .unwrap()
                .matches(".param")
                .count();
            assert_eq!(
                declared,
                kernel.params.len(),
                "{} declares another parameter count than its spec",
                kernel.name
            );
        }
        for instruction in [
            "shfl.sync.bfly",
            "bar.sync",
            "ex2.approx",
            "lg2.approx",
            "sqrt.rn",
        ] {
            assert!(
                ptx.contains(instruction),
                "no {instruction} in the {} PTX",
                arch.name()
            );
        }
        let entries = ptx.matches(".visible .entry ").count();
        assert_eq!(entries, KERNELS.len(), "unexpected entry points");
    }
}

#[test]
fn ptx_golden() {
    for arch in GpuArch::ALL {
        let file = format!("kernels.{}.ptx", arch.name());
        common::check_golden(&file, &compile_ptx(arch).unwrap());
    }
}
