//! What a tuning verifies ([`Verify`]), and the check of the step it hands on
//! ([`verify_chosen`]).

use slimpack_ir::batch::Batch;
use slimpack_ir::{Spec, StepIr};
use slimpack_passes::PassError;

use super::autotune::{evaluate_with, TuneError, TuneOptions};
use super::strategy::{Candidate, StrategyInfo};

/// What the tuning verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Nothing (`--no-verify`).
    Off,
    /// The chosen step, the one handed on (the default; a tuning's choice, and each step's
    /// among the kept configurations, [`verify_chosen`]): a broken one is compiled again
    /// verifying every pass, so that the error names the pass that broke it. Candidates not
    /// chosen are discarded unverified.
    Chosen,
    /// Every compiled candidate's step (`--verify-candidates`; one pruned by its bounds is not
    /// compiled to the end): a broken candidate fails the tuning though it would not have been
    /// chosen — for testing the passes, at the verifier's cost on every candidate.
    Candidates,
}

impl Verify {
    /// From the command line's flags: `--no-verify` (nothing) and `--verify-candidates`
    /// (every candidate); neither, the step handed on.
    pub fn from_flags(no_verify: bool, every_candidate: bool) -> Verify {
        match (no_verify, every_candidate) {
            (true, _) => Verify::Off,
            (false, false) => Verify::Chosen,
            (false, true) => Verify::Candidates,
        }
    }

    /// Whether anything is verified (the pass manager's verification of what follows the
    /// tuning, `lower`).
    pub fn any(self) -> bool {
        self != Verify::Off
    }
}

/// With [`Verify::Chosen`], verifies `ir`, the step `candidate` (its pipelines all among its
/// variants) made of `batch` and a tuning chose; a broken one is compiled again verifying
/// every pass, so that the error names the pass that broke it.
pub fn verify_chosen(
    strategy: &StrategyInfo,
    spec: &Spec,
    batch: &Batch,
    limit: u64,
    tune: &TuneOptions,
    candidate: &Candidate,
    ir: &StepIr,
) -> Result<(), TuneError> {
    if tune.verify != Verify::Chosen {
        return Ok(());
    }
    let Err(source) = slimpack_ir::verify::verify(ir) else {
        return Ok(());
    };
    let every_pass = TuneOptions {
        verify: Verify::Candidates,
        ..tune.clone()
    };
    evaluate_with(strategy, spec, batch, candidate, limit, &every_pass)?;
    Err(TuneError::Compile {
        strategy: strategy.name,
        candidate: candidate.label.clone(),
        source: Box::new(PassError::Invalid {
            after: None,
            source,
        }),
    })
}
