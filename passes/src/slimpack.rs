//! slimpack's own strategy: the pipeline of the SlimPack method, the knobs the driver searches,
//! and the ablations that switch one idea off.
//!
//! Pipeline: `assign-dp` (phase 1: balance replicas on FLOPs), `dp-merge` (CP groups for
//! dominant or over-long samples), `slice{size=S}`, `pack-fwd{cap=C}` and `pack-bwd{cap=C}`
//! (phase 2: two different partitions, each balanced on its own direction's cost), `eqsat`
//! (e-graph refinement of the packs), `schedule-pipeline` (slice-level 1F1B, memory-aware).
//! Knobs: the slice size `S` (an eighth or a half of the context, at least 1024 tokens), the
//! pack cap `C` (the context, as the peers' bins), a static CP degree taken from the DP pool (as the peers may; without
//! one, DP-Merge forms CP groups per sample), and the recompute mode; the driver scores every
//! candidate with the simulator and keeps the fastest that fits memory.
//!
//! Ablations (`--no-<idea>` on the command line, `slimpack-no-<idea>` as strategy names):
//! `asymmetric` (backward packs mirror the forward ones), `dp-merge`, `slicing` (whole
//! samples), `eqsat`.

use slimpack_ir::batch::Batch;
use slimpack_ir::Spec;

use crate::strategy::{capacity, cp_degrees, Candidate, Choices, StrategyState};

/// Which ideas a variant keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ideas {
    pub asymmetric: bool,
    pub dp_merge: bool,
    pub slicing: bool,
    pub eqsat: bool,
}

impl Ideas {
    /// The full method.
    pub const ALL: Ideas = Ideas {
        asymmetric: true,
        dp_merge: true,
        slicing: true,
        eqsat: true,
    };
}

/// Slice sizes tried for a context length: context / 8 and / 2, at least 1024 tokens, without
/// duplicates.
pub fn slice_sizes(context: u32) -> Vec<u32> {
    let mut sizes: Vec<u32> = [8, 2]
        .iter()
        .map(|&d| (context / d).max(1024).min(context))
        .collect();
    sizes.dedup();
    sizes
}

/// The candidates of a variant: slice sizes x static CP degrees x recompute modes.
pub fn candidates_with(
    ideas: Ideas,
    spec: &Spec,
    batch: &Batch,
    choices: &Choices,
) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    for cp in cp_degrees(spec) {
        candidates.extend(candidates_at(ideas, cp, batch, choices));
    }
    candidates
}

/// The candidates with `cp` DP ranks per replica (a static CP group; DP-Merge only without
/// one, since it merges single ranks).
fn candidates_at(ideas: Ideas, cp: u32, batch: &Batch, choices: &Choices) -> Vec<Candidate> {
    let context = capacity(batch);
    let sizes = if ideas.slicing {
        slice_sizes(context)
    } else {
        vec![context]
    };
    let mut candidates = Vec::new();
    for size in sizes {
        // Packs as large as the context: GEMMs near their peak, few per-pack overheads; the
        // slices are what lets a pack mix pieces of long and short samples at that size.
        let cap = context.max(size);
        let mut passes = vec![if cp > 1 {
            format!("assign-dp{{cp={cp}}}")
        } else {
            "assign-dp".to_string()
        }];
        if ideas.dp_merge && cp == 1 {
            passes.push("dp-merge".into());
        }
        if ideas.slicing {
            passes.push(format!("slice{{size={size}}}"));
        }
        passes.push(format!("pack-fwd{{cap={cap}}}"));
        passes.push(if ideas.asymmetric {
            format!("pack-bwd{{cap={cap}}}")
        } else {
            "pack-bwd{mirror=true}".to_string()
        });
        if ideas.eqsat {
            passes.push("eqsat".into());
        }
        passes.push("schedule-pipeline".into());
        for &recompute in &choices.recompute {
            candidates.push(Candidate {
                label: format!(
                    "cp={cp},slice={size},cap={cap},recompute={}",
                    recompute.as_str()
                ),
                pipeline: passes.join(","),
                recompute,
            });
        }
        if !ideas.slicing {
            break;
        }
    }
    candidates
}

macro_rules! variant {
    ($name:ident, $ideas:expr) => {
        pub(crate) fn $name(
            spec: &Spec,
            batch: &Batch,
            _: &StrategyState,
            choices: &Choices,
        ) -> Vec<Candidate> {
            candidates_with($ideas, spec, batch, choices)
        }
    };
}

variant!(full, Ideas::ALL);
variant!(
    no_asymmetric,
    Ideas {
        asymmetric: false,
        ..Ideas::ALL
    }
);
variant!(
    no_dp_merge,
    Ideas {
        dp_merge: false,
        ..Ideas::ALL
    }
);
variant!(
    no_slicing,
    Ideas {
        slicing: false,
        ..Ideas::ALL
    }
);
variant!(
    no_eqsat,
    Ideas {
        eqsat: false,
        ..Ideas::ALL
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_sizes_follow_the_context() {
        assert_eq!(slice_sizes(131072), vec![16384, 65536]);
        assert_eq!(slice_sizes(4096), vec![1024, 2048]);
        assert_eq!(slice_sizes(1024), vec![1024]);
    }
}
