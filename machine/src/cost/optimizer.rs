//! The optimizer step: Adam over this device's shard of the distributed optimizer, plus zeroing
//! the local gradient buffer. Both are memory-bound, so their time is bytes touched over achieved
//! HBM bandwidth (the multi-tensor-apply kernels do a handful of FLOPs per byte).
//!
//! Contract: seconds on one device; the step starts after the gradient reduce-scatter and the
//! parameter all-gather follows it ([`super::DpSyncTime`]).

use super::memory::{ADAM_STATE_BYTES, MAIN_GRAD_BYTES, MASTER_WEIGHT_BYTES};

/// Bytes Adam touches per parameter of its shard, besides writing the low-precision weight:
/// read the fp32 gradient twice (once for the global gradient norm used by clipping, once for
/// the update), read and write the fp32 master weight and both fp32 moments
/// (Megatron-LM `optimizer/distrib_optimizer.py` with apex/TE `FusedAdam`).
pub const ADAM_BYTES_PER_SHARD_PARAM: u64 =
    2 * MAIN_GRAD_BYTES + 2 * MASTER_WEIGHT_BYTES + 2 * ADAM_STATE_BYTES;

/// Bytes per local parameter to zero the fp32 main-gradient buffer for the next step.
pub const ZERO_GRAD_BYTES_PER_PARAM: u64 = MAIN_GRAD_BYTES;

/// Bytes one device moves in the optimizer step: Adam over `shard_params` parameters, writing
/// back a separate low-precision weight of `weight_copy_bytes` (0 for fp32 models, whose master
/// weight is the weight), and zeroing the gradients of its `local_params`.
pub fn optimizer_bytes(shard_params: u64, local_params: u64, weight_copy_bytes: u64) -> u64 {
    shard_params * (ADAM_BYTES_PER_SHARD_PARAM + weight_copy_bytes)
        + local_params * ZERO_GRAD_BYTES_PER_PARAM
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_bytes_by_hand() {
        // 8 (grad twice) + 8 (master r/w) + 16 (m, v r/w) = 32, plus the bf16 weight write.
        assert_eq!(ADAM_BYTES_PER_SHARD_PARAM, 32);
        assert_eq!(optimizer_bytes(100, 400, 2), 100 * 34 + 400 * 4);
    }
}
