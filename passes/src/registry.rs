//! The registry: every pass by name, with its summary, description and options.
//!
//! Adding a pass means adding its file and one entry to [`PASSES`].

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassOptions};

/// What the registry knows of a pass without creating it.
pub struct PassInfo {
    pub name: &'static str,
    /// One line, shown by `slimpack passes`.
    pub summary: &'static str,
    /// A few sentences: what it does, its contract, the phases in and out.
    pub description: &'static str,
    pub options: &'static [OptionInfo],
    /// Builds the pass from its (already name-checked) options.
    pub create: fn(&PassOptions) -> Result<Box<dyn Pass>>,
}

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
