//! The text form of a program's op lists: one block per worker, one op per line, packs by their
//! IR names (and, with model chunks, `chunk=c` on every pack op). The IR printer appends it to a lowered step; the parser checks that the blocks it
//! reads are exactly what the schedule lowers to (they are derived, never edited by hand).

use std::fmt::Write;

use super::{Op, Program};

/// Prints every worker's block, indented by two spaces (inside the `step { }` of the IR).
pub fn print_workers(program: &Program, out: &mut String) {
    let name = |pack: u32| program.packs[pack as usize].name.as_str();
    for wp in &program.workers {
        let _ = writeln!(out, "  worker dp={} pp={} {{", wp.worker.dp, wp.worker.pp);
        for op in &wp.ops {
            out.push_str("    ");
            out.push_str(op.keyword());
            let _ = match op {
                Op::Forward { pack, .. } => write!(out, " {}", name(*pack)),
                Op::Backward { pack, part, .. } => {
                    write!(out, " {}{}", name(*pack), part.suffix())
                }
                Op::CpExchange {
                    pack,
                    direction,
                    group,
                    ..
                } => {
                    let group: Vec<String> = group.iter().map(u32::to_string).collect();
                    write!(
                        out,
                        " {} {} group=[{}]",
                        direction.keyword(),
                        name(*pack),
                        group.join(", ")
                    )
                }
                Op::Send {
                    pack,
                    direction,
                    to,
                    ..
                } => write!(
                    out,
                    " {} {} to dp={} pp={}",
                    direction.keyword(),
                    name(*pack),
                    to.dp,
                    to.pp
                ),
                Op::Recv {
                    pack,
                    direction,
                    from,
                    ..
                } => write!(
                    out,
                    " {} {} from dp={} pp={}",
                    direction.keyword(),
                    name(*pack),
                    from.dp,
                    from.pp
                ),
                Op::ReduceScatter | Op::Optimizer | Op::AllGather => Ok(()),
            };
            if program.vpp > 1 && op.pack().is_some() {
                let _ = write!(out, " chunk={}", op.chunk());
            }
            out.push('\n');
        }
        out.push_str("  }\n");
    }
}
