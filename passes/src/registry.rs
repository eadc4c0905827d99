//! The registry: every pass by name, with its summary, description and options.
//!
//! Adding a pass means adding its file (with its `const INFO: PassInfo`) and one entry to
//! [`PASSES`].

use crate::error::{PassError, Result};
pub use crate::pass::PassInfo;

/// Every registered pass, in pipeline order.
pub static PASSES: &[PassInfo] = &[
    crate::assign_dp::INFO,
    crate::assign_hybrid_cp::INFO,
    crate::dp_merge::INFO,
    crate::slice::INFO,
    crate::pack_fwd::INFO,
    crate::pack_bwd::INFO,
    crate::eqsat::INFO,
    crate::pack_symmetric::INFO,
    crate::schedule_pipeline::INFO,
    crate::assign_recompute::INFO,
    crate::interleave_ranks::INFO,
    crate::lower::INFO,
];

/// Looks a pass up by name.
pub fn lookup(name: &str) -> Result<&'static PassInfo> {
    PASSES
        .iter()
        .find(|info| info.name == name)
        .ok_or_else(|| PassError::UnknownPass {
            name: name.to_string(),
            valid: PASSES
                .iter()
                .map(|info| info.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}
