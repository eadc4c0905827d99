//! slimpack-codegen.
