//! placeholder: the cost and memory model is being written.
