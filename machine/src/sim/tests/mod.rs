//! Tests of the simulator: hand-computed steps (`hand`) and where their time goes (`losses`), properties over random batches and
//! layouts (`properties`), and the pictures (`pictures`).

mod hand;
mod losses;
mod pictures;
mod properties;

use crate::cost::CostModel;
use slimpack_ir::spec::Spec;
use slimpack_ir::step::{Direction, StepIr};

use super::fixture::{one_f_one_b, ReplicaPlan};
use super::{simulate, SimResult};

/// A spec from presets.
fn spec(model: &str, cluster: &str, parallel: &str) -> Spec {
    Spec::from_presets(model, cluster, parallel).unwrap()
}

/// One plain replica per DP rank, in rank order.
fn plain(packs_per_rank: &[Vec<Vec<u32>>]) -> Vec<ReplicaPlan> {
    packs_per_rank
        .iter()
        .enumerate()
        .map(|(rank, packs)| ReplicaPlan {
            ranks: vec![rank as u32],
            packs: packs.clone(),
        })
        .collect()
}

/// Builds the fixture, checks it with the IR verifier, and simulates it.
fn run(spec: Spec, replicas: &[ReplicaPlan]) -> (StepIr, CostModel, SimResult) {
    let ir = one_f_one_b(spec, replicas);
    checked_run(ir)
}

/// Verifies and simulates an IR.
fn checked_run(ir: StepIr) -> (StepIr, CostModel, SimResult) {
    slimpack_ir::verify::verify(&ir).unwrap();
    let cost = CostModel::new(&ir.spec);
    let result = simulate(&ir, &cost).unwrap();
    (ir, cost, result)
}

/// Two DP replicas of llama-7b on one stage, one pack each (8,192 and 2,048 tokens): the
/// simulated step and each replica's pack compute (forward + backward), long then short.
fn unequal_replicas() -> (CostModel, SimResult, f64, f64) {
    let (_, cost, result) = run(
        spec("llama-7b", "h100-sxm", "tp=1,pp=1,dp=2"),
        &plain(&[vec![vec![8192]], vec![vec![2048]]]),
    );
    let compute = |len: u64, rank: u32| {
        cost.pack_time_on(0, &[(len, 0)], Direction::Forward, &[rank])
            .critical_path_s()
            + cost
                .pack_time_on(0, &[(len, 0)], Direction::Backward, &[rank])
                .critical_path_s()
    };
    let (long, short) = (compute(8192, 0), compute(2048, 1));
    (cost, result, long, short)
}

/// `a == b` up to floating-point rounding of sums.
fn assert_close(a: f64, b: f64, what: &str) {
    let tolerance = 1e-12 * a.abs().max(b.abs()).max(1e-30);
    assert!((a - b).abs() <= tolerance, "{what}: {a} vs {b}");
}
