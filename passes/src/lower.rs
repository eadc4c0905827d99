//! `lower`: the scheduled step to per-worker op lists (phase scheduled -> lowered).
//!
//! The lowering itself is [`slimpack_ir::program::lower`], a pure function of the schedule;
//! this pass stores its result in the step ([`slimpack_ir::program::lower_into`], which also
//! proves it executable: every send received, every collective met, no deadlock), so that the
//! printer, codegen and the runtimes read one program. The manager moves the phase on.

use slimpack_ir::program;
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

use crate::error::{PassError, Result};
use crate::pass::{Pass, PassContext, PassInfo, Statistics};

pub(crate) const INFO: PassInfo = PassInfo {
    name: "lower",
    summary: "lower the schedule to per-worker op lists (what codegen and the runtimes run)",
    description: "Per (DP rank, stage) worker: its replicas' packs in schedule order, each with \
                  its receive, CP exchange (DP-Merge groups), compute and send; then the \
                  stage's gradient reduce-scatter, optimizer step and parameter all-gather. \
                  Proves the op lists executable. Phase scheduled -> lowered.",
    accepts: Phase::Scheduled..=Phase::Lowered,
    produces: Some(Phase::Lowered),
    options: &[],
    create: |_| Ok(Box::new(Lower)),
};

/// The lowering pass.
#[derive(Debug, Clone, Copy)]
pub struct Lower;

impl Pass for Lower {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }

    fn run(&mut self, ir: &mut StepIr, _: &PassContext) -> Result<Statistics> {
        program::lower_into(ir).map_err(|e| PassError::Failed {
            pass: INFO.name,
            message: e.message,
        })?;
        let program = ir.program().expect("lower_into stores the program");
        let mut stats = Statistics::new()
            .with("workers", program.workers.len())
            .with("packs", program.packs.len());
        for (kind, count) in program.op_counts() {
            stats.set(&format!("ops.{kind}"), count);
        }
        Ok(stats)
    }
}
