//! The one error type of `slimpack-machine`: calibrations that cannot be read or do not match
//! the device, and steps the simulator cannot run. Every variant renders as one line naming
//! what was wrong and where; the CLI prints it verbatim.

use std::path::PathBuf;

use slimpack_ir::step::Phase;

/// Why a machine model could not be built or a step could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A calibration file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A calibration file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A calibration is malformed, or was measured on another device than the cluster's.
    #[error("{what}: {message}")]
    Calibration { what: String, message: String },
    /// The IR has not been scheduled yet.
    #[error("the simulator needs a scheduled step IR, got phase '{phase}' (run the passes through schedule-pipeline first)")]
    NotScheduled { phase: Phase },
    /// The IR has not been packed yet (what a bound on its schedules needs).
    #[error("a bound on the step needs a packed step IR, got phase '{phase}'")]
    NotPacked { phase: Phase },
    /// The IR is not packed forward only (what a bound on its backward packings needs).
    #[error("a bound on the step's backward packings needs a step IR packed forward only (phase 'assigned'), got phase '{phase}'")]
    NotForwardPacked { phase: Phase },
    /// The cost model was built for another spec than the IR's.
    #[error("the cost model describes {cost} but the IR was compiled for {ir}")]
    SpecMismatch { cost: String, ir: String },
    /// The IR's stages do not match the layout's pipeline degree.
    #[error("the IR has {stages} stages but the layout has pp={pp}")]
    Stages { stages: usize, pp: u32 },
    /// A replica names a DP rank outside the layout.
    #[error("replica %r{replica} has DP rank {rank}, outside dp={dp}")]
    RankOutOfRange { replica: usize, rank: u32, dp: u32 },
    /// A replica has no DP ranks.
    #[error("replica %r{replica} has no DP ranks")]
    EmptyReplica { replica: usize },
    /// A per-stage schedule does not list the replica's packs exactly once each.
    #[error("schedule %r{replica} %st{stage}: {message}")]
    Schedule {
        replica: usize,
        stage: u32,
        message: String,
    },
    /// Some tasks never became ready: the dependencies form a cycle.
    #[error("the schedule deadlocks: {task} never becomes ready ({unfinished} of {total} tasks cannot run)")]
    Deadlock {
        task: String,
        unfinished: usize,
        total: usize,
    },
}

impl MachineError {
    pub(crate) fn calibration(what: impl Into<String>, message: impl Into<String>) -> Self {
        MachineError::Calibration {
            what: what.into(),
            message: message.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = MachineError> = std::result::Result<T, E>;
