//! The MLIR backend on small schedules: golden snapshots of the `slimpack` dialect, the lowered
//! `func`/`scf`/`llvm` module and the LLVM IR; stock `mlir-opt-22` parses and verifies the
//! emitted dialect with the shipped IRDL file and rejects a broken one; `llc-22` compiles the
//! LLVM IR.
#![cfg(feature = "mlir")]

mod common;

use std::process::Command;

use common::{check_golden, irdl_file, program, tool, SCHEDULES};
use slimpack_codegen::mlir::{emit_llvm_ir, emit_lowered, emit_mlir, TO_LLVM_DIALECT};

fn temp_file(dir: &tempfile::TempDir, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn dialect_golden() {
    for name in SCHEDULES {
        check_golden(&format!("{name}.mlir"), &emit_mlir(&program(name)).unwrap());
    }
}

#[test]
fn lowered_golden() {
    for name in SCHEDULES {
        let lowered = emit_lowered(&program(name)).unwrap();
        check_golden(&format!("{name}.lowered.mlir"), &lowered);
    }
}

#[test]
fn llvm_ir_golden() {
    for name in SCHEDULES {
        check_golden(
            &format!("{name}.ll"),
            &emit_llvm_ir(&program(name)).unwrap(),
        );
    }
}

#[test]
fn every_device_op_becomes_one_runtime_call() {
    for name in SCHEDULES {
        let program = program(name);
        let llvm_ir = emit_llvm_ir(&program).unwrap();
        for (keyword, count) in program.op_counts() {
            let symbol = format!("@slimpack_rt_{}(", keyword.replace('-', "_"))
                .replace("_fwd(", "_forward(")
                .replace("_bwd(", "_backward(");
            let calls = llvm_ir.matches(&format!("call void {symbol}")).count();
            assert_eq!(calls, count, "{name}: {keyword} ops vs calls of {symbol}");
        }
    }
}

fn mlir_opt(args: &[&str], input: &std::path::Path) -> std::process::Output {
    Command::new("mlir-opt-22")
        .args(args)
        .arg(input)
        .output()
        .unwrap()
}

#[test]
fn mlir_opt_verifies_the_emitted_dialect_with_the_irdl_file() {
    let Some(_) = tool("mlir-opt-22") else { return };
    let irdl = format!("--irdl-file={}", irdl_file().display());
    let dir = tempfile::tempdir().unwrap();
    for name in SCHEDULES {
        let text = emit_mlir(&program(name)).unwrap();
        let path = temp_file(&dir, &format!("{name}.mlir"), &text);
        let output = mlir_opt(&[&irdl, "--verify-each"], &path);
        assert!(
            output.status.success(),
            "mlir-opt-22 rejected {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        // A direction the dialect does not define must be rejected: the IRDL file really
        // constrains the ops.
        let broken = text.replacen("direction = \"fwd\"", "direction = \"sideways\"", 1);
        let path = temp_file(&dir, &format!("{name}.broken.mlir"), &broken);
        let output = mlir_opt(&[&irdl], &path);
        assert!(
            !output.status.success(),
            "mlir-opt-22 accepted {name} broken"
        );
        assert!(String::from_utf8_lossy(&output.stderr).contains("sideways"));
    }
}

#[test]
fn mlir_opt_converts_the_lowered_module_and_llc_compiles_the_llvm_ir() {
    let dir = tempfile::tempdir().unwrap();
    for name in SCHEDULES {
        let program = program(name);
        if tool("mlir-opt-22").is_some() {
            let lowered = temp_file(
                &dir,
                &format!("{name}.lowered.mlir"),
                &emit_lowered(&program).unwrap(),
            );
            let pipeline = format!("--pass-pipeline={TO_LLVM_DIALECT}");
            let output = mlir_opt(&[&pipeline], &lowered);
            assert!(
                output.status.success(),
                "mlir-opt-22 could not convert {name}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        if tool("llc-22").is_some() {
            let llvm_ir = temp_file(
                &dir,
                &format!("{name}.ll"),
                &emit_llvm_ir(&program).unwrap(),
            );
            let object = llvm_ir.with_extension("o");
            let output = Command::new("llc-22")
                .args(["-filetype=obj", "-o"])
                .arg(&object)
                .arg(&llvm_ir)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "llc-22 rejected {name}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(std::fs::metadata(&object).unwrap().len() > 0);
        }
    }
}
