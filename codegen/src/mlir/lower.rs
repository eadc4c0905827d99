//! `lower-to-runtime-calls`: the `slimpack` dialect to `func`/`scf`/`llvm`, one call into the
//! runtime's C ABI per op.
//!
//! In: a verified `slimpack` module (as [`super::print_dialect`] writes it, or as another tool
//! left it). Out: a module of
//! - `func.func private @slimpack_rt_<op>(...)` declarations, one per op kind; every argument is
//!   an i64 (`dp`, `pp` of the calling device first, then the pack id, the direction as
//!   0 = forward / 1 = backward, peers as `dp`, `pp`), and a CP group is a pointer to a constant
//!   `llvm.mlir.global` array of DP ranks and its length;
//! - `func.func @slimpack_device_dp<D>_pp<P>()`: the device's ops in order, as calls;
//! - `func.func @slimpack_run_device(index)`: runs device `pp · dp_count + dp` (the program's
//!   worker order) through an `scf.index_switch` — what a runtime's worker thread calls;
//! - `func.func @slimpack_run_step()`: runs every device in worker order (`scf.for`), the order
//!   in which the runtime's interpreter walks the program.
//!
//! The lowering reads only the dialect, never the `Program`, and checks the structure IRDL
//! cannot: a step header first, then packs, then each device header followed by exactly its
//! `ops` ops, each naming that device.

use std::fmt::Write;

use melior::ir::attribute::{DenseI64ArrayAttribute, IntegerAttribute, StringAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::Module;

use slimpack_ir::program::abi::{self, Function, Param};

use crate::CodegenError;

/// A C ABI function's parameter types in MLIR (every `i64`, a CP group as a pointer and a
/// count), from its declaration.
fn parameter_types(function: &Function) -> String {
    let types: Vec<&str> = function
        .params
        .iter()
        .map(|param| match param {
            Param::Int(_) => "i64",
            Param::Group => "!llvm.ptr, i64",
        })
        .collect();
    types.join(", ")
}

fn malformed(message: String) -> CodegenError {
    CodegenError::Mlir {
        stage: "lower-to-runtime-calls",
        message,
    }
}

fn op_name(op: &OperationRef) -> String {
    op.name().as_string_ref().as_str().unwrap_or("").to_string()
}

fn int(op: &OperationRef, name: &str) -> Result<i64, CodegenError> {
    let attribute = op
        .attribute(name)
        .map_err(|_| malformed(format!("{} has no attribute {name}", op_name(op))))?;
    IntegerAttribute::try_from(attribute)
        .map(|a| a.value())
        .map_err(|_| malformed(format!("{}'s {name} is not an integer", op_name(op))))
}

fn direction(op: &OperationRef) -> Result<i64, CodegenError> {
    let attribute = op
        .attribute("direction")
        .map_err(|_| malformed(format!("{} has no direction", op_name(op))))?;
    let text = StringAttribute::try_from(attribute)
        .map_err(|_| malformed(format!("{}'s direction is not a string", op_name(op))))?;
    match text.value() {
        "fwd" => Ok(0),
        "bwd" => Ok(1),
        other => Err(malformed(format!("unknown direction {other:?}"))),
    }
}

fn dense(op: &OperationRef, name: &str) -> Result<Vec<i64>, CodegenError> {
    let attribute = op
        .attribute(name)
        .map_err(|_| malformed(format!("{} has no attribute {name}", op_name(op))))?;
    let array = DenseI64ArrayAttribute::try_from(attribute)
        .map_err(|_| malformed(format!("{}'s {name} is not an i64 array", op_name(op))))?;
    (0..array.len())
        .map(|i| array.element(i).map_err(|e| malformed(e.to_string())))
        .collect()
}

/// Builds the lowered module's text; SSA values are numbered per function.
struct Emitter {
    globals: String,
    functions: String,
    next_value: usize,
    groups: usize,
}

impl Emitter {
    fn constant(&mut self, value: i64) -> String {
        let name = format!("%v{}", self.next_value);
        self.next_value += 1;
        let _ = writeln!(self.functions, "    {name} = arith.constant {value} : i64");
        name
    }

    /// A call of `function` with `args`, its group (if it has one) a constant global.
    fn call(&mut self, function: &Function, args: &[i64], group: &[i64]) {
        let mut values: Vec<String> = args.iter().map(|&a| self.constant(a)).collect();
        if function.params.contains(&Param::Group) {
            let global = format!("slimpack_group_{}", self.groups);
            self.groups += 1;
            let ranks: Vec<String> = group.iter().map(i64::to_string).collect();
            let _ = writeln!(
                self.globals,
                "  llvm.mlir.global internal constant @{global}(dense<[{}]> : tensor<{}xi64>) \
                 {{addr_space = 0 : i32}} : !llvm.array<{} x i64>",
                ranks.join(", "),
                group.len(),
                group.len()
            );
            let pointer = format!("%v{}", self.next_value);
            self.next_value += 1;
            let _ = writeln!(
                self.functions,
                "    {pointer} = llvm.mlir.addressof @{global} : !llvm.ptr"
            );
            values.push(pointer);
            values.push(self.constant(group.len() as i64));
        }
        let _ = writeln!(
            self.functions,
            "    func.call @{}({}) : ({}) -> ()",
            function.symbol,
            values.join(", "),
            parameter_types(function)
        );
    }

    /// Lowers one device op to its call: the C ABI function declared for the dialect op, its
    /// integer arguments read from the attributes of the same names.
    fn op(&mut self, op: &OperationRef, device: [i64; 2]) -> Result<(), CodegenError> {
        let name = op_name(op);
        let [dp, pp] = device;
        let named = [int(op, "dp")?, int(op, "pp")?];
        if named != device {
            return Err(malformed(format!(
                "{name} names device dp={} pp={} inside device dp={dp} pp={pp}",
                named[0], named[1]
            )));
        }
        let function = abi::function_for_dialect_op(&name)
            .ok_or_else(|| malformed(format!("{name} is not a device op")))?;
        let mut args = Vec::new();
        let mut group = Vec::new();
        for param in function.params {
            match param {
                Param::Int("direction") => args.push(direction(op)?),
                Param::Int(attribute) => args.push(int(op, attribute)?),
                Param::Group => group = dense(op, "group")?,
            }
        }
        self.call(function, &args, &group);
        Ok(())
    }
}

/// Lowers a verified `slimpack` module to the text of a `func`/`scf`/`llvm` module.
pub fn lower_to_runtime_calls(schedule: &Module) -> Result<String, CodegenError> {
    let mut ops = Vec::new();
    let mut next = schedule.body().first_operation();
    while let Some(op) = next {
        next = op.next_in_block();
        ops.push(op);
    }
    let Some(step) = ops.first().filter(|op| op_name(op) == "slimpack.step") else {
        return Err(malformed(
            "the module does not start with slimpack.step".into(),
        ));
    };
    let (pp, dp) = (int(step, "pp")?, int(step, "dp")?);
    let (device_count, pack_count) = (int(step, "devices")?, int(step, "packs")?);

    let mut rest = ops[1..].iter().peekable();
    let mut packs = 0;
    while rest.peek().is_some_and(|op| op_name(op) == "slimpack.pack") {
        rest.next();
        packs += 1;
    }
    if packs != pack_count {
        return Err(malformed(format!(
            "{packs} packs, the step says {pack_count}"
        )));
    }

    let mut emitter = Emitter {
        globals: String::new(),
        functions: String::new(),
        next_value: 0,
        groups: 0,
    };
    let mut devices = Vec::new();
    while let Some(header) = rest.next() {
        if op_name(header) != "slimpack.device" {
            return Err(malformed(format!("{} outside a device", op_name(header))));
        }
        let device = [int(header, "dp")?, int(header, "pp")?];
        let expected_index = devices.len() as i64;
        if device[1] * dp + device[0] != expected_index {
            return Err(malformed(format!(
                "device dp={} pp={} out of worker order (expected worker {expected_index})",
                device[0], device[1]
            )));
        }
        let function = format!("slimpack_device_dp{}_pp{}", device[0], device[1]);
        let _ = writeln!(emitter.functions, "  func.func @{function}() {{");
        emitter.next_value = 0;
        for _ in 0..int(header, "ops")? {
            let op = rest
                .next()
                .ok_or_else(|| malformed(format!("{function} has fewer ops than declared")))?;
            emitter.op(op, device)?;
        }
        emitter.functions.push_str("    return\n  }\n");
        devices.push(function);
    }
    if devices.len() as i64 != device_count || device_count != pp * dp {
        return Err(malformed(format!(
            "{} devices, the step says {device_count} (pp={pp}, dp={dp})",
            devices.len()
        )));
    }
    Ok(assemble(&emitter, &devices))
}

fn assemble(emitter: &Emitter, devices: &[String]) -> String {
    let mut out = String::from("module {\n");
    out.push_str(&emitter.globals);
    for function in abi::FUNCTIONS {
        let _ = writeln!(
            out,
            "  func.func private @{}({})",
            function.symbol,
            parameter_types(function)
        );
    }
    out.push_str(&emitter.functions);

    out.push_str("  func.func @slimpack_run_device(%device: index) {\n");
    out.push_str("    scf.index_switch %device\n");
    for (index, function) in devices.iter().enumerate() {
        let _ = writeln!(out, "    case {index} {{");
        let _ = writeln!(out, "      func.call @{function}() : () -> ()");
        out.push_str("      scf.yield\n    }\n");
    }
    out.push_str("    default {\n    }\n    return\n  }\n");

    out.push_str("  func.func @slimpack_run_step() {\n");
    out.push_str("    %first = arith.constant 0 : index\n");
    out.push_str("    %one = arith.constant 1 : index\n");
    let _ = writeln!(
        out,
        "    %devices = arith.constant {} : index",
        devices.len()
    );
    out.push_str("    scf.for %device = %first to %devices step %one {\n");
    out.push_str("      func.call @slimpack_run_device(%device) : (index) -> ()\n");
    out.push_str("    }\n    return\n  }\n}\n");
    out
}
