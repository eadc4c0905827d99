//! slimpack facade.
pub use slimpack_ir as ir;
