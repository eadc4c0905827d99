// The slimpack dialect, in IRDL: load it into stock MLIR tools with
//   mlir-opt-22 --irdl-file=codegen/dialect/slimpack.irdl.mlir schedule.mlir
// (and into a melior context with `load_irdl_dialects`). IRDL operations have no custom
// assembly, so slimpack's files use MLIR's generic syntax.
//
// A schedule file is a flat module: one `slimpack.step`, one `slimpack.pack` per pack of the
// lowered program, then for every worker (the TP x static-CP devices of one DP rank on one
// pipeline stage, which run the same ops in lockstep) a `slimpack.device` followed by its `ops`
// ops in program order. Flat, because IRDL cannot give an op the NoTerminator trait, and a
// region of slimpack ops would need a terminator no upstream dialect offers outside its own
// parents. Every op repeats its device (`dp`, `pp`) so it reads, and lowers, on its own, like
// the C ABI call it becomes. Packs are named by `id` (their index in the program); directions
// are "fwd" or "bwd"; peers are (dp, pp) workers. Each constraint value below is used once:
// IRDL unifies a value used twice (two attributes would then have to be equal).
irdl.dialect @slimpack {
  // The step's header: `pp` stages, `dp` DP ranks, how many devices and packs follow.
  irdl.operation @step {
    %version = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %dp = irdl.base "#builtin.integer"
    %devices = irdl.base "#builtin.integer"
    %packs = irdl.base "#builtin.integer"
    irdl.attributes {
      "version" = %version, "pp" = %pp, "dp" = %dp, "devices" = %devices, "packs" = %packs
    }
  }

  // A pack's varlen layout. `slices`: one array<i64: sample, start, end, kv_start> per slice;
  // `cu_seqlens_q/k`, `max_seqlen_q/k`, `position_offsets` as in Megatron's packed THD format.
  irdl.operation @pack {
    %id = irdl.base "#builtin.integer"
    %name = irdl.base "#builtin.string"
    %fwd = irdl.is "fwd"
    %bwd = irdl.is "bwd"
    %direction = irdl.any_of(%fwd, %bwd)
    %replica = irdl.base "#builtin.integer"
    %dp_ranks = irdl.base "#builtin.dense_array"
    %slices = irdl.base "#builtin.array"
    %padded_tokens = irdl.base "#builtin.integer"
    %cu_seqlens_q = irdl.base "#builtin.dense_array"
    %cu_seqlens_k = irdl.base "#builtin.dense_array"
    %max_seqlen_q = irdl.base "#builtin.integer"
    %max_seqlen_k = irdl.base "#builtin.integer"
    %position_offsets = irdl.base "#builtin.dense_array"
    irdl.attributes {
      "id" = %id, "name" = %name, "direction" = %direction, "replica" = %replica,
      "dp_ranks" = %dp_ranks, "slices" = %slices, "padded_tokens" = %padded_tokens,
      "cu_seqlens_q" = %cu_seqlens_q, "cu_seqlens_k" = %cu_seqlens_k,
      "max_seqlen_q" = %max_seqlen_q, "max_seqlen_k" = %max_seqlen_k,
      "position_offsets" = %position_offsets
    }
  }

  // Opens a worker's op list: the next `ops` ops are its program, in order.
  irdl.operation @device {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %ops = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp, "ops" = %ops }
  }

  // Run a pack's forward (backward) on the device's layers.
  irdl.operation @forward {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %pack = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp, "pack" = %pack }
  }
  irdl.operation @backward {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %pack = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp, "pack" = %pack }
  }

  // Exchange a pack's K/V (and, backward, their gradients) among a DP-Merge group's ranks.
  irdl.operation @cp_exchange {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %pack = irdl.base "#builtin.integer"
    %fwd = irdl.is "fwd"
    %bwd = irdl.is "bwd"
    %direction = irdl.any_of(%fwd, %bwd)
    %group = irdl.base "#builtin.dense_array"
    irdl.attributes { "dp" = %dp, "pp" = %pp, "pack" = %pack, "direction" = %direction, "group" = %group }
  }

  // Send a pack's activations (fwd) or input gradients (bwd) to worker (to_dp, to_pp).
  irdl.operation @send {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %pack = irdl.base "#builtin.integer"
    %fwd = irdl.is "fwd"
    %bwd = irdl.is "bwd"
    %direction = irdl.any_of(%fwd, %bwd)
    %to_dp = irdl.base "#builtin.integer"
    %to_pp = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp, "pack" = %pack, "direction" = %direction, "to_dp" = %to_dp, "to_pp" = %to_pp }
  }

  // Receive a pack's activations (fwd) or output gradients (bwd) from worker (from_dp, from_pp).
  irdl.operation @recv {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    %pack = irdl.base "#builtin.integer"
    %fwd = irdl.is "fwd"
    %bwd = irdl.is "bwd"
    %direction = irdl.any_of(%fwd, %bwd)
    %from_dp = irdl.base "#builtin.integer"
    %from_pp = irdl.base "#builtin.integer"
    irdl.attributes {
      "dp" = %dp, "pp" = %pp, "pack" = %pack, "direction" = %direction, "from_dp" = %from_dp, "from_pp" = %from_pp
    }
  }

  // End of step: reduce-scatter the stage's gradients over the DP ranks, step the optimizer on
  // this rank's shard, all-gather the updated parameters.
  irdl.operation @reduce_scatter {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp }
  }
  irdl.operation @optimizer {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp }
  }
  irdl.operation @all_gather {
    %dp = irdl.base "#builtin.integer"
    %pp = irdl.base "#builtin.integer"
    irdl.attributes { "dp" = %dp, "pp" = %pp }
  }
}
