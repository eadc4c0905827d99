//! The compiled schedule driver runs the step exactly as the runtime's interpreter does: both
//! paths go through the runtime's C ABI, and the calls they make (device, op, pack, peers, CP
//! group) are recorded and compared. The driver is also written as a native object file.
#![cfg(all(feature = "mlir", feature = "llvm"))]

mod common;

use common::{program, SCHEDULES};
use slimpack_codegen::llvm::driver::{run_step, with_run_device, write_object};
use slimpack_codegen::mlir::emit_llvm_ir;
use slimpack_runtime::abi;

#[test]
fn compiled_driver_makes_the_interpreters_calls() {
    for name in SCHEDULES {
        let program = program(name);
        let llvm_ir = emit_llvm_ir(&program).unwrap();
        let ((), interpreted) = abi::record(|| abi::interpret(&program));
        let (result, compiled) = abi::record(|| run_step(&llvm_ir, &abi::symbols()));
        result.unwrap();
        let op_count: usize = program.workers.iter().map(|w| w.ops.len()).sum();
        assert_eq!(interpreted.len(), op_count, "{name}: one call per op");
        assert_eq!(
            compiled, interpreted,
            "{name}: compiled and interpreted calls differ"
        );
        assert!(
            interpreted
                .iter()
                .any(|call| call.function == &slimpack_ir::program::abi::FORWARD),
            "{name}: no forward call recorded"
        );
    }
}

/// What a runtime's worker threads do: each calls `slimpack_run_device(its index)` on its own
/// thread, and makes exactly its worker's interpreted calls.
#[test]
fn each_device_entry_makes_its_workers_calls_on_its_own_thread() {
    for name in SCHEDULES {
        let program = program(name);
        let llvm_ir = emit_llvm_ir(&program).unwrap();
        let per_thread = with_run_device(&llvm_ir, &abi::symbols(), |run_device| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..program.workers.len())
                    .map(|index| {
                        // SAFETY: the JIT-compiled entry point lives while the closure runs.
                        scope.spawn(move || abi::record(|| unsafe { run_device(index as i64) }).1)
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .unwrap();
        for (worker, compiled) in program.workers.iter().zip(per_thread) {
            let ((), interpreted) = abi::record(|| abi::interpret_worker(worker));
            assert!(
                !interpreted.is_empty(),
                "{name}: worker {:?} has no ops",
                worker.worker
            );
            assert_eq!(compiled, interpreted, "{name}: worker {:?}", worker.worker);
        }
    }
}

#[test]
fn a_driver_missing_a_runtime_symbol_is_refused() {
    let program = program(SCHEDULES[0]);
    let llvm_ir = emit_llvm_ir(&program).unwrap();
    let symbols: Vec<_> = abi::symbols()
        .into_iter()
        .filter(|(name, _)| *name != "slimpack_rt_send")
        .collect();
    let error = run_step(&llvm_ir, &symbols).unwrap_err().to_string();
    assert!(error.contains("slimpack_rt_send"), "{error}");
}

#[test]
fn the_driver_compiles_to_a_native_object_defining_its_entry_points() {
    let program = program(SCHEDULES[0]);
    let llvm_ir = emit_llvm_ir(&program).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("driver.o");
    write_object(&llvm_ir, &path).unwrap();
    let object = std::fs::read(&path).unwrap();
    assert_eq!(&object[..4], b"\x7fELF", "not an ELF object");
    for symbol in [
        "slimpack_run_step",
        "slimpack_run_device",
        "slimpack_rt_forward",
    ] {
        assert!(
            object.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
            "{symbol} not in the object's symbol table"
        );
    }
}
