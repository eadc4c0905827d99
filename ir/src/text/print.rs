//! The printer: [`StepIr`] to canonical text.

use std::fmt::Write;

use super::names::Names;
use crate::program;
use crate::step::{Direction, StepIr};

/// Prints the IR in its canonical text form.
pub fn print(ir: &StepIr) -> String {
    let mut out = String::with_capacity(64 * ir.samples().len() + 1024);
    let names = Names::new(ir);
    let _ = writeln!(out, "step phase={} {{", ir.phase());
    header(ir, &mut out);
    for &stage_id in ir.stages() {
        let stage = ir.stage(stage_id);
        let _ = write!(
            out,
            "  {} = stage layers={}..{}",
            names.stage(stage_id),
            stage.first_layer,
            stage.first_layer + stage.layers
        );
        match stage.recompute {
            Some(mode) => {
                let _ = writeln!(out, " recompute={mode}");
            }
            None => out.push('\n'),
        }
    }
    for &replica in ir.replicas() {
        let ranks: Vec<String> = ir
            .replica(replica)
            .ranks
            .iter()
            .map(u32::to_string)
            .collect();
        let _ = writeln!(
            out,
            "  {} = replica dp=[{}]",
            names.replica(replica),
            ranks.join(", ")
        );
    }
    for &sample_id in ir.samples() {
        let sample = ir.sample(sample_id);
        let _ = write!(
            out,
            "  {} = sample len={} doc={} piece={}",
            names.sample(sample_id),
            sample.len,
            sample.doc,
            sample.piece
        );
        if let Some(replica) = ir.replica_of_sample(sample_id) {
            let _ = write!(out, " on {}", names.replica(replica));
        }
        out.push('\n');
        for slice_id in ir.slices_of(sample_id) {
            let slice = ir.slice(slice_id);
            let _ = writeln!(
                out,
                "    {} = slice {}..{}",
                names.slice(slice_id),
                slice.start,
                slice.end()
            );
        }
    }
    for &replica in ir.replicas() {
        for direction in [Direction::Forward, Direction::Backward] {
            for pack_id in ir.packs_on(replica, direction) {
                let _ = write!(
                    out,
                    "  {} = pack {} on {}",
                    names.pack(pack_id),
                    direction.keyword(),
                    names.replica(replica)
                );
                if let Some(cap) = ir.pack(pack_id).cap {
                    let _ = write!(out, " cap={cap}");
                }
                if let Some(padded) = ir.padding(pack_id) {
                    let _ = write!(out, " pad={padded}");
                }
                let members: Vec<&str> = ir
                    .pack_members(pack_id)
                    .iter()
                    .map(|&s| names.slice(s))
                    .collect();
                let _ = writeln!(out, " [{}]", members.join(", "));
            }
        }
    }
    for &replica in ir.replicas() {
        for &stage_id in ir.stages() {
            let order = ir.stage_ops(replica, ir.stage(stage_id).index);
            if order.is_empty() {
                continue;
            }
            let packs: Vec<String> = order
                .iter()
                .map(|op| format!("{}{}", names.pack(op.pack), op.part.suffix()))
                .collect();
            let _ = writeln!(
                out,
                "  schedule {} {} [{}]",
                names.replica(replica),
                names.stage(stage_id),
                packs.join(", ")
            );
        }
    }
    for &replica in ir.replicas() {
        for device in 0..ir.spec.parallel.pp {
            if let Some(chunks) = ir.interleave(replica, device) {
                let chunks: Vec<String> = chunks.iter().map(u32::to_string).collect();
                let _ = writeln!(
                    out,
                    "  interleave {} pp={device} [{}]",
                    names.replica(replica),
                    chunks.join(", ")
                );
            }
        }
    }
    if ir.has_pack_recompute() {
        pack_recompute(ir, &names, &mut out);
    }
    for ((rank, device), order) in ir.rank_orders() {
        let replicas: Vec<&str> = order
            .iter()
            .map(|&replica| names.replica(replica))
            .collect();
        let _ = writeln!(
            out,
            "  order dp={rank} pp={device} [{}]",
            replicas.join(", ")
        );
    }
    if let Some(program) = ir.program() {
        program::print_workers(program, &mut out);
    }
    out.push_str("}\n");
    out
}

/// `recompute %st0 block:2 [%f0, %f3]`: per stage, the forward packs that save under a mode
/// of their own, by mode (in the order of their first pack), packs in canonical order.
fn pack_recompute(ir: &StepIr, names: &Names, out: &mut String) {
    let own: std::collections::HashMap<_, _> = ir.pack_recomputes().collect();
    for &stage_id in ir.stages() {
        let stage = ir.stage(stage_id).index;
        let mut by_mode: Vec<(crate::spec::Recompute, Vec<&str>)> = Vec::new();
        for &replica in ir.replicas() {
            for pack in ir.packs_on(replica, Direction::Forward) {
                let Some(&mode) = own.get(&(pack, stage)) else {
                    continue;
                };
                match by_mode.iter_mut().find(|(m, _)| *m == mode) {
                    Some((_, packs)) => packs.push(names.pack(pack)),
                    None => by_mode.push((mode, vec![names.pack(pack)])),
                }
            }
        }
        for (mode, packs) in by_mode {
            let _ = writeln!(
                out,
                "  recompute {} {mode} [{}]",
                names.stage(stage_id),
                packs.join(", ")
            );
        }
    }
}

fn header(ir: &StepIr, out: &mut String) {
    let spec = &ir.spec;
    let model = &spec.model;
    let _ = writeln!(
        out,
        "  model name={} layers={} hidden={} heads={} kv_heads={} head_dim={} ffn={} vocab={} dtype={} recompute={} tied_embeddings={}",
        quote(&model.name),
        model.layers,
        model.hidden,
        model.heads,
        model.kv_heads,
        model.head_dim,
        model.ffn,
        model.vocab,
        model.dtype.as_str(),
        model.recompute,
        model.tied_embeddings
    );
    let cluster = &spec.cluster;
    let gpu = &cluster.gpu;
    let _ = writeln!(
        out,
        "  gpu name={} peak_flops={} hbm_bytes={} hbm_bandwidth={}",
        quote(&gpu.name),
        gpu.peak_flops,
        gpu.hbm_bytes,
        gpu.hbm_bandwidth
    );
    let _ = writeln!(
        out,
        "  cluster name={} gpus_per_node={} intra_bandwidth={} intra_latency={} inter_bandwidth={} inter_latency={}",
        quote(&cluster.name),
        cluster.gpus_per_node,
        cluster.intra_node.bandwidth,
        cluster.intra_node.latency,
        cluster.inter_node.bandwidth,
        cluster.inter_node.latency
    );
    let parallel = &spec.parallel;
    let _ = write!(out, "  parallel tp={}", parallel.tp);
    if let Some(cp) = parallel.cp {
        let _ = write!(out, " cp={cp}");
    }
    let _ = write!(out, " pp={}", parallel.pp);
    if parallel.vpp != 1 {
        let _ = write!(out, " vpp={}", parallel.vpp);
    }
    let _ = writeln!(out, " dp={}", parallel.dp);
    let batch = &ir.batch;
    let _ = write!(out, "  batch source={}", quote(&batch.source));
    if let Some(context) = batch.context {
        let _ = write!(out, " context={context}");
    }
    let _ = writeln!(
        out,
        " documents={} documents_cut={}",
        batch.documents, batch.documents_cut
    );
}

/// A string literal with `"`, `\` and newlines escaped (the lexer's escapes).
fn quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}
