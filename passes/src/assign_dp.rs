//! `assign-dp`: phase 1 of the solver — place every sample on a DP replica so that replica step
//! costs balance.
//!
//! Phase in: `logical`. Phase out: `assigned`. Creates one replica per DP rank of the layout and
//! places samples by longest-processing-time-first on their estimated cost (forward plus backward
//! FLOPs of the whole sample under the machine model, so attention's quadratic term counts),
//! then improves the placement by moving or swapping samples between the most and least loaded
//! replicas while the maximum load drops. `balance=tokens` balances token counts instead (what
//! token-balancing packers do); `balance=none` deals samples round-robin in batch order (what a
//! plain distributed sampler does).

use std::ops::RangeInclusive;

pub use crate::balance::Balance;
use crate::balance::{imbalance, lpt, refine, sample_weights};
use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassOptions, Statistics};
use crate::registry::PassInfo;
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "assign-dp",
    summary: "place samples on DP replicas, balancing estimated step cost",
    description: "Creates one replica per DP rank and places every sample: LPT on forward + \
                  backward FLOPs, then move/swap refinement between the most and least loaded \
                  replicas. Phase logical -> assigned.",
    options: &[OptionInfo {
        name: "balance",
        help: "cost (default: FLOPs incl. quadratic attention), tokens, or none (round-robin)",
    }],
    create: |options| Ok(Box::new(AssignDp::from_options(options)?)),
};

/// The DP assignment pass.
#[derive(Debug, Clone, Copy)]
pub struct AssignDp {
    pub balance: Balance,
}

impl AssignDp {
    fn from_options(options: &PassOptions) -> Result<AssignDp> {
        let balance = match options
            .get::<String>("balance", "cost, tokens or none")?
            .as_deref()
        {
            None | Some("cost") => Balance::Cost,
            Some("tokens") => Balance::Tokens,
            Some("none") => Balance::None,
            Some(other) => {
                return Err(PassError::BadOption {
                    pass: INFO.name,
                    option: "balance".into(),
                    value: other.into(),
                    message: "expected cost, tokens or none".into(),
                })
            }
        };
        Ok(AssignDp { balance })
    }
}

impl Pass for AssignDp {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn accepts(&self) -> RangeInclusive<Phase> {
        Phase::Logical..=Phase::Logical
    }

    fn produces(&self) -> Option<Phase> {
        Some(Phase::Assigned)
    }

    fn run(&mut self, ir: &mut StepIr) -> Result<Statistics> {
        let bins = ir.spec.parallel.dp as usize;
        let cost = sample_weights(ir, Balance::Cost);
        let (bin_of, steps) = match self.balance {
            Balance::None => ((0..cost.len()).map(|i| i % bins).collect(), 0),
            Balance::Cost => {
                let mut bin_of = lpt(&cost, &vec![0.0; bins]);
                let steps = refine(&cost, &mut bin_of, &vec![0.0; bins]);
                (bin_of, steps)
            }
            Balance::Tokens => {
                let tokens = sample_weights(ir, Balance::Tokens);
                let mut bin_of = lpt(&tokens, &vec![0.0; bins]);
                let steps = refine(&tokens, &mut bin_of, &vec![0.0; bins]);
                (bin_of, steps)
            }
        };
        let replicas: Vec<_> = (0..bins as u32)
            .map(|rank| ir.add_replica(vec![rank]))
            .collect();
        for (index, &sample) in ir.samples().to_vec().iter().enumerate() {
            ir.place_sample(sample, replicas[bin_of[index]]);
        }
        Ok(Statistics::new()
            .with("replicas", bins)
            .with("refinement_steps", steps)
            .with("cost_imbalance", imbalance(&cost, &bin_of, bins)))
    }
}
