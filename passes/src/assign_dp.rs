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
//!
//! `cp=K` takes a static context-parallel degree out of the DP pool, as Megatron-LM does when
//! `--context-parallel-size K` is set at a fixed world size: `dp / K` replicas of `K`
//! consecutive DP ranks each (`[0..K)`, `[K..2K)`, ...), every one a CP group that runs all of
//! its samples split `K` ways. `K` must divide `dp`; `cp=1` (the default) is one replica per rank.

pub use crate::balance::Balance;
use crate::balance::{imbalance, lpt, refine, sample_weights};
use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassContext, PassInfo, PassOptions, Statistics};
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "assign-dp",
    summary: "place samples on DP replicas, balancing estimated step cost",
    description: "Creates one replica per DP rank and places every sample: LPT on forward + \
                  backward FLOPs, then move/swap refinement between the most and least loaded \
                  replicas. Phase logical -> assigned.",
    accepts: Phase::Logical..=Phase::Logical,
    produces: Some(Phase::Assigned),
    options: &[
        OptionInfo {
            name: "balance",
            help: "cost (FLOPs incl. quadratic attention), tokens, or none (round-robin)",
            default: Some("cost"),
        },
        OptionInfo {
            name: "cp",
            help: "static CP degree taken from the DP pool: dp/cp replicas of cp ranks",
            default: Some("1"),
        },
    ],
    create: |options| Ok(Box::new(AssignDp::from_options(options)?)),
};

/// The DP assignment pass.
#[derive(Debug, Clone, Copy)]
pub struct AssignDp {
    pub balance: Balance,
    /// DP ranks per replica (a static CP group); divides `dp`.
    pub cp: u32,
}

impl AssignDp {
    fn from_options(options: &PassOptions) -> Result<AssignDp> {
        let balance = match options.choice("balance", &["cost", "tokens", "none"])? {
            Some("tokens") => Balance::Tokens,
            Some("none") => Balance::None,
            _ => Balance::Cost,
        };
        let cp = options.required_positive("cp")?;
        Ok(AssignDp { balance, cp })
    }
}

impl Pass for AssignDp {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics> {
        let dp = ir.spec.parallel.dp;
        if dp % self.cp != 0 {
            return Err(PassError::Failed {
                pass: INFO.name,
                message: format!("cp={} does not divide dp={dp}", self.cp),
            });
        }
        let bins = (dp / self.cp) as usize;
        let cost = sample_weights(ir, cx.machine(), Balance::Cost);
        let (bin_of, steps) = match self.balance {
            Balance::None => ((0..cost.len()).map(|i| i % bins).collect(), 0),
            Balance::Cost => {
                let mut bin_of = lpt(&cost, &vec![0.0; bins]);
                let steps = refine(&cost, &mut bin_of, &vec![0.0; bins]);
                (bin_of, steps)
            }
            Balance::Tokens => {
                let tokens = sample_weights(ir, cx.machine(), Balance::Tokens);
                let mut bin_of = lpt(&tokens, &vec![0.0; bins]);
                let steps = refine(&tokens, &mut bin_of, &vec![0.0; bins]);
                (bin_of, steps)
            }
        };
        let cp = self.cp;
        let replicas: Vec<_> = (0..bins as u32)
            .map(|group| ir.add_replica((group * cp..(group + 1) * cp).collect()))
            .collect();
        let placements: Vec<_> = (ir.samples().iter().zip(&bin_of))
            .map(|(&sample, &bin)| (sample, replicas[bin]))
            .collect();
        ir.place_samples(&placements);
        Ok(Statistics::new()
            .with("replicas", bins)
            .with("refinement_steps", steps)
            .with("cost_imbalance", imbalance(&cost, &bin_of, bins)))
    }
}
