//! slimpack-runtime.
