//! placeholder: the CPU backend is being written.
