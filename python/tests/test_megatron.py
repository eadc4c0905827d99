"""Schedule.packed_seq_params builds Megatron-Core's PackedSeqParams from every pack."""

import numpy as np
import pytest

import slimpack

megatron = pytest.importorskip("megatron.core.packed_seq_params", reason="needs megatron-core")
torch = pytest.importorskip("torch")

SCHEDULES = [
    dict(
        lengths=[900, 300, 2500, 70, 1200, 4100, 650],
        model="llama-7b",
        cluster="h100-sxm",
        parallel="tp=8,pp=2,dp=2",
        context=4096,
    ),
    # The tuning chooses a static CP degree of 2 here: padded offsets on multiples of 4.
    dict(
        lengths=[90, 30, 250, 7, 120, 61],
        model="tiny",
        cluster="cpu",
        parallel="pp=2,dp=2",
        strategy="megatron",
    ),
    dict(
        lengths=[600, 30, 40, 50, 20, 35, 25, 44],
        model="tiny",
        cluster="h100-sxm",
        parallel="pp=2,dp=2",
        passes="assign-dp,dp-merge{threshold=1.0},slice{size=64},pack-fwd{cap=128},pack-bwd{cap=96},schedule-pipeline",
    ),
]


@pytest.mark.parametrize("arguments", SCHEDULES)
def test_packed_seq_params_from_every_pack(arguments):
    arguments = dict(arguments)
    schedule = slimpack.plan(arguments.pop("lengths"), **arguments)
    assert schedule.packs
    for pack in schedule.packs:
        params = schedule.packed_seq_params(pack)
        assert isinstance(params, megatron.PackedSeqParams)
        assert params.qkv_format == "thd"
        for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            tensor = getattr(params, name)
            assert tensor.dtype == torch.int32 and tensor.dim() == 1, name
            assert bool((tensor[1:] >= tensor[:-1]).all()), name
        for name in ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            assert np.array_equal(getattr(params, name).numpy(), pack.document["packed_seq_params"][name]), (
                name
            )
        assert int(params.cu_seqlens_q[-1]) == pack.tokens
        assert int(params.cu_seqlens_q_padded[-1]) >= pack.padded_tokens >= pack.tokens
        assert params.max_seqlen_q == int(np.diff(pack.cu_seqlens_q_padded).max())
        assert params.max_seqlen_kv == int(np.diff(pack.cu_seqlens_kv_padded).max())
        assert schedule.packed_seq_params(pack.index).max_seqlen_q == params.max_seqlen_q
