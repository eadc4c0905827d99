//! slimpack-passes.
