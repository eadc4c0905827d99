//! The machine model's memory terms for `cpu` devices against the runtime's own buffers, byte
//! for byte (capacities: what the counting allocator counts): the activations a forward pack
//! saves, the K/V rows it keeps, and the dK/dV accumulators a sample's backward holds.

use slimpack_ir::Spec;
use slimpack_machine::cost::MemoryModel;

use crate::cpu::{LayerRange, ModelConfig, Params, SampleId, StageState, TokenBatch, TokenSlice};

fn slice(sample: usize, start: usize, len: usize) -> TokenSlice {
    TokenSlice {
        sample: SampleId(sample),
        start,
        len,
    }
}

#[test]
fn saved_activations_kv_and_kv_grads_are_what_the_cpu_memory_model_counts() {
    let spec = Spec::from_presets("tiny", "cpu", "tp=1,pp=2,dp=1").unwrap();
    let memory = MemoryModel::new(&spec);
    let config = ModelConfig::from_spec(&spec.model).unwrap();
    let stages = LayerRange::split_even(&config, 2).unwrap();
    let params = Params::init(&config, 0).split(&stages).unwrap();
    let batch = TokenBatch::synthetic(&config, &[300, 200], 1).unwrap();
    let (head, tail, other) = (slice(0, 0, 100), slice(0, 100, 200), slice(1, 0, 200));
    let mut first = StageState::new(&config, stages[0]);
    let mut last = StageState::new(&config, stages[1]);
    let mut grads = params[1].zeros_like();

    let out = first
        .forward_pack(&params[0], &batch, &[head, other], &[])
        .unwrap();
    last.forward_pack(&params[1], &batch, &[head, other], &out.hidden)
        .unwrap();
    for (state, stage) in [(&first, 0), (&last, 1)] {
        let live = state.live_bytes();
        assert_eq!(live.activations as u64, memory.activation_bytes(300, stage));
        assert_eq!(live.kv as u64, memory.kv_bytes(300, stage));
    }
    let out = first
        .forward_pack(&params[0], &batch, &[tail], &[])
        .unwrap();
    last.forward_pack(&params[1], &batch, &[tail], &out.hidden)
        .unwrap();
    let live = last.live_bytes();
    assert_eq!(live.activations as u64, memory.activation_bytes(500, 1));
    assert_eq!(live.kv as u64, memory.kv_bytes(500, 1));
    assert_eq!(live.kv_grads, 0);

    // The backward of sample 0's last slice leaves the accumulators of its earlier slice.
    last.backward_pack(&params[1], &mut grads, &batch, &[tail], &[])
        .unwrap();
    let live = last.live_bytes();
    assert_eq!(live.activations as u64, memory.activation_bytes(300, 1));
    assert_eq!(live.kv as u64, memory.kv_bytes(300, 1));
    assert_eq!(live.kv_grads as u64, memory.kv_grad_bytes(100, 1));
    last.backward_pack(&params[1], &mut grads, &batch, &[head, other], &[])
        .unwrap();
    assert_eq!(last.live_bytes().total(), 0);
}
