//! placeholder
pub struct StepIr;
