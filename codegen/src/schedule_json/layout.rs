//! The parallel layout a document states, and the step IR's.
//!
//! A layout without `cp` lets a strategy take a static CP degree `k` out of the DP pool: the IR
//! then keeps `dp` pool ranks and forms `dp / k` replicas of `k` consecutive ranks. A trainer
//! needs the layout it runs: `cp = k`, `dp / k` DP ranks, and every device's cp coordinate. Both
//! number the devices alike (Megatron's order puts cp right inside dp, so pool rank `g·k + c`
//! is DP rank `g` with cp coordinate `c`), so only coordinates and DP rank names change.

use slimpack_ir::spec::ParallelSpec;
use slimpack_ir::StepIr;

use super::ScheduleError;

/// The document's layout of a step and how its DP ranks map to the IR's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// The layout the document states (`cp` always present).
    pub parallel: ParallelSpec,
    /// Whether the strategy chose `parallel.cp` (the IR's layout has no `cp`).
    pub cp_chosen: bool,
}

impl Layout {
    /// The layout of `ir`: its static CP degree when every replica is a block of `k` consecutive
    /// pool ranks (in order) and the layout named no cp; the IR's layout with cp made explicit
    /// otherwise.
    pub fn of_ir(ir: &StepIr) -> Layout {
        let parallel = ir.spec.parallel;
        if parallel.cp.is_some() {
            return Layout {
                parallel,
                cp_chosen: false,
            };
        }
        let blocks: Vec<&Vec<u32>> = ir
            .replicas()
            .iter()
            .map(|&r| &ir.replica(r).ranks)
            .collect();
        let k = blocks.first().map_or(1, |ranks| ranks.len() as u32);
        let static_cp = k > 1
            && blocks.len() as u32 * k == parallel.dp
            && blocks
                .iter()
                .enumerate()
                .all(|(g, ranks)| ranks.iter().copied().eq(g as u32 * k..(g as u32 + 1) * k));
        let k = if static_cp { k } else { 1 };
        Layout {
            parallel: ParallelSpec {
                cp: Some(k),
                dp: parallel.dp / k,
                ..parallel
            },
            cp_chosen: true,
        }
    }

    /// The layout a document states (`parallel`, `cp_chosen`), checked.
    pub fn of_document(parallel: ParallelSpec, cp_chosen: bool) -> Result<Layout, ScheduleError> {
        if parallel.cp.is_none() {
            return Err(ScheduleError::Invalid(
                "spec.parallel: cp is missing (a schedule document states the CP degree it runs)"
                    .to_string(),
            ));
        }
        Ok(Layout {
            parallel,
            cp_chosen,
        })
    }

    /// The static CP degree.
    pub fn cp(&self) -> u32 {
        self.parallel.cp_degree()
    }

    /// The step IR's layout: a chosen CP degree goes back into the DP pool.
    pub fn ir_parallel(&self) -> ParallelSpec {
        if self.cp_chosen {
            ParallelSpec {
                cp: None,
                dp: self.parallel.dp * self.cp(),
                ..self.parallel
            }
        } else {
            self.parallel
        }
    }

    /// The document's DP ranks of IR DP ranks (a chosen CP block becomes its DP rank).
    pub fn dp_ranks_of_ir(&self, ranks: &[u32]) -> Vec<u32> {
        if !self.cp_chosen {
            return ranks.to_vec();
        }
        let mut out: Vec<u32> = ranks.iter().map(|&r| r / self.cp()).collect();
        out.dedup();
        out
    }

    /// The IR's DP ranks of document DP ranks (each with its chosen CP block).
    pub fn ir_dp_ranks(&self, ranks: &[u32]) -> Vec<u32> {
        if !self.cp_chosen {
            return ranks.to_vec();
        }
        let k = self.cp();
        ranks
            .iter()
            .flat_map(|&g| g.saturating_mul(k)..g.saturating_mul(k).saturating_add(k))
            .collect()
    }

    /// CP members of a replica of `dp_ranks` document DP ranks.
    pub fn cp_size(&self, dp_ranks: usize) -> u32 {
        dp_ranks as u32 * self.cp()
    }
}
