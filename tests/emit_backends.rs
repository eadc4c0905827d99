//! `compile --emit mlir|llvm|ptx` from the command line: the forms come out with the backends'
//! features, and a build without them says, in one line, which feature to build with.

mod common;

use common::slimpack;

const SPEC: &[&str] = &[
    "compile",
    "--model",
    "tiny",
    "--cluster",
    "cpu",
    "--parallel",
    "tp=1,pp=2,dp=2",
    "--batch",
    "codegen/tests/data/lengths.txt",
    "--strategy",
    "slimpack",
];

fn emit(form: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("out.{form}"));
    let mut args = SPEC.to_vec();
    let out_text = out.display().to_string();
    args.extend(["--emit", form, "-o", &out_text]);
    let output = slimpack(&args);
    if output.status.success() {
        let emitted = std::fs::read_to_string(&out).unwrap();
        // Hand the emitted text back on stdout for the checks.
        return std::process::Output {
            stdout: emitted.into_bytes(),
            ..output
        };
    }
    output
}

fn assert_one_line_error(output: &std::process::Output, feature: &str) {
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("--features {feature}")),
        "{stderr}"
    );
}

#[test]
fn emit_mlir_and_llvm() {
    for form in ["mlir", "llvm"] {
        let output = emit(form);
        if cfg!(feature = "mlir") {
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let text = String::from_utf8(output.stdout).unwrap();
            let expected = if form == "mlir" {
                "\"slimpack.step\"()"
            } else {
                "define void @slimpack_run_step()"
            };
            assert!(text.contains(expected), "{form}: {expected} missing");
        } else {
            assert_one_line_error(&output, "mlir");
        }
    }
}

#[test]
fn emit_ptx() {
    let output = emit("ptx");
    if cfg!(feature = "llvm") {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let ptx = String::from_utf8(output.stdout).unwrap();
        assert!(ptx.contains(".target sm_90"));
        #[cfg(feature = "llvm")]
        for kernel in slimpack_codegen::llvm::kernels::KERNELS {
            let entry = format!(".visible .entry {}(", kernel.name);
            assert!(ptx.contains(&entry), "{} missing", kernel.name);
        }
    } else {
        assert_one_line_error(&output, "llvm");
    }
}
