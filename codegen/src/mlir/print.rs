//! Printing a lowered [`Program`] in the `slimpack` dialect (generic syntax; the dialect's IRDL
//! definition, `codegen/dialect/slimpack.irdl.mlir`, says what each op and attribute means).
//!
//! The output is deterministic (programs are ordered) and self-contained: a step header, every
//! pack's layout, then each worker's device header followed by its ops.

use std::fmt::Write;

use slimpack_ir::program::{Op, PackLayout, Program, Worker};
use slimpack_ir::step::Direction;

/// The `version` attribute of `slimpack.step`; bumped on any incompatible change of the dialect.
pub const DIALECT_VERSION: u32 = 1;

/// The program as a `slimpack` dialect module.
pub fn print_dialect(program: &Program) -> String {
    let mut out = String::new();
    out.push_str("module {\n");
    let _ = writeln!(
        out,
        "  \"slimpack.step\"() {{version = {DIALECT_VERSION} : i64, pp = {} : i64, dp = {} : i64, \
         devices = {} : i64, packs = {} : i64}} : () -> ()",
        program.pp,
        program.dp,
        program.workers.len(),
        program.packs.len()
    );
    for (id, pack) in program.packs.iter().enumerate() {
        print_pack(id, pack, &mut out);
    }
    for worker_program in &program.workers {
        let Worker { dp, pp } = worker_program.worker;
        let _ = writeln!(
            out,
            "  \"slimpack.device\"() {{dp = {dp} : i64, pp = {pp} : i64, ops = {} : i64}} : () -> ()",
            worker_program.ops.len()
        );
        for op in &worker_program.ops {
            print_op(worker_program.worker, op, &mut out);
        }
    }
    out.push_str("}\n");
    out
}

fn direction(direction: Direction) -> &'static str {
    match direction {
        Direction::Forward => "fwd",
        Direction::Backward => "bwd",
    }
}

fn dense(values: impl IntoIterator<Item = u32>) -> String {
    let values: Vec<String> = values.into_iter().map(|v| v.to_string()).collect();
    if values.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", values.join(", "))
    }
}

/// An MLIR string literal (pack names are IR names such as `%f3`; quotes and backslashes are
/// escaped all the same).
fn string_literal(text: &str) -> String {
    let mut literal = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                literal.push('\\');
                literal.push(c);
            }
            _ => literal.push(c),
        }
    }
    literal.push('"');
    literal
}

fn print_pack(id: usize, pack: &PackLayout, out: &mut String) {
    let slices: Vec<String> = pack
        .slices
        .iter()
        .map(|s| dense([s.sample, s.start, s.end, s.kv_start]))
        .collect();
    let _ = writeln!(
        out,
        "  \"slimpack.pack\"() {{id = {id} : i64, name = {}, direction = \"{}\", replica = {} : i64, \
         dp_ranks = {}, slices = [{}], padded_tokens = {} : i64, cu_seqlens_q = {}, \
         cu_seqlens_k = {}, max_seqlen_q = {} : i64, max_seqlen_k = {} : i64, \
         position_offsets = {}}} : () -> ()",
        string_literal(&pack.name),
        direction(pack.direction),
        pack.replica,
        dense(pack.dp_ranks.iter().copied()),
        slices.join(", "),
        pack.padded_tokens,
        dense(pack.cu_seqlens_q.iter().copied()),
        dense(pack.cu_seqlens_k.iter().copied()),
        pack.max_seqlen_q,
        pack.max_seqlen_k,
        dense(pack.position_offsets.iter().copied()),
    );
}

fn print_op(worker: Worker, op: &Op, out: &mut String) {
    let device = format!("dp = {} : i64, pp = {} : i64", worker.dp, worker.pp);
    let (name, attributes) = match op {
        Op::Forward { pack, .. } => ("forward", format!("{device}, pack = {pack} : i64")),
        Op::Backward { pack, .. } => ("backward", format!("{device}, pack = {pack} : i64")),
        Op::CpExchange {
            pack,
            direction: d,
            group,
            ..
        } => (
            "cp_exchange",
            format!(
                "{device}, pack = {pack} : i64, direction = \"{}\", group = {}",
                direction(*d),
                dense(group.iter().copied())
            ),
        ),
        Op::Send {
            pack,
            direction: d,
            to,
            ..
        } => (
            "send",
            format!(
                "{device}, pack = {pack} : i64, direction = \"{}\", to_dp = {} : i64, \
                 to_pp = {} : i64",
                direction(*d),
                to.dp,
                to.pp
            ),
        ),
        Op::Recv {
            pack,
            direction: d,
            from,
            ..
        } => (
            "recv",
            format!(
                "{device}, pack = {pack} : i64, direction = \"{}\", from_dp = {} : i64, \
                 from_pp = {} : i64",
                direction(*d),
                from.dp,
                from.pp
            ),
        ),
        Op::ReduceScatter => ("reduce_scatter", device),
        Op::Optimizer => ("optimizer", device),
        Op::AllGather => ("all_gather", device),
    };
    let _ = writeln!(out, "  \"slimpack.{name}\"() {{{attributes}}} : () -> ()");
}
