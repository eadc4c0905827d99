"""slimpack.torch runs schedules exactly: loss and every gradient equal the unsliced fp64 step.

Multi-rank schedules run one process per rank (torch.distributed, gloo). Relative errors are
measured against `slimpack.torch.reference` (every sample whole, one autograd call) and must
be <= 1e-10; the negative controls must be caught.
"""

import json

import pytest

import slimpack
import slimpack.torch as st
from conftest import step_errors

TOLERANCE = 1e-10
LENGTHS = [90, 30, 250, 7, 120, 61, 40, 33, 180, 16]
# Slices of 16 tokens: most samples become chains of continuation slices.
SMALL_SLICES = "assign-dp,slice{size=16},pack-fwd{cap=64},pack-bwd{cap=48},schedule-pipeline"
DP_MERGE = (
    "assign-dp,dp-merge{threshold=1.0},slice{size=64},pack-fwd{cap=128},pack-bwd{cap=96},schedule-pipeline"
)
MERGE_LENGTHS = [600, 30, 40, 50, 20, 35, 25, 44]


def assert_exact(schedule, **options):
    reference_loss, reference_grads = st.reference(schedule)
    step = st.run(schedule, options=st.Options(**options) if options else None)
    loss_error, (grad_error, where) = step_errors(step, reference_loss, reference_grads)
    assert loss_error <= TOLERANCE, f"{schedule.candidate}: loss relative error {loss_error:.2e}"
    assert grad_error <= TOLERANCE, f"{schedule.candidate}: {where} relative error {grad_error:.2e}"
    for rank in step.ranks:
        assert rank.leftover == {"kv_chunks": 0, "groups": 0, "messages": 0}, rank
    return step


def continuation_slices(schedule) -> int:
    return sum(1 for pack in schedule.forward_packs for row in pack.slices if row[1] > 0)


@pytest.mark.parametrize("strategy", slimpack.strategies())
def test_every_strategy_single_rank(strategy):
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="dp=1", strategy=strategy)
    assert_exact(schedule)


@pytest.mark.parametrize("strategy", [s for s in slimpack.strategies() if s != "hybrid-cp"])
def test_every_strategy_pp2_dp2(strategy):
    # On h100-sxm the tuning keeps DP replicas apart (pipeline sends, DP gradient sync and the
    # tied-embedding sync between the stages all run).
    schedule = slimpack.plan(
        LENGTHS, model="tiny", cluster="h100-sxm", parallel="pp=2,dp=2", strategy=strategy
    )
    assert schedule.world == 4
    assert_exact(schedule)


def test_hybrid_cp_dp2():
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="dp=2", strategy="hybrid-cp")
    assert_exact(schedule)


def test_chosen_static_cp_pp2():
    # On the cpu cluster the tuning runs the DP pool of 2 as one replica with CP degree 2.
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="pp=2,dp=2", strategy="kk")
    assert schedule.parallel["cp"] == 2 and schedule.document["cp_chosen"]
    assert all(pack.cp_size == 2 for pack in schedule.packs)
    assert_exact(schedule)


def test_dp_merge_beside_plain_replicas_with_continuation_slices_pp2_dp2():
    schedule = slimpack.plan(
        MERGE_LENGTHS, model="tiny", cluster="h100-sxm", parallel="pp=2,dp=2", passes=DP_MERGE
    )
    replicas = schedule.replicas
    assert any(len(r) == 1 for r in replicas) and any(len(r) > 1 for r in replicas), replicas
    assert continuation_slices(schedule) >= 4
    assert_exact(schedule)


def test_small_slices_with_many_continuations_single_rank_and_pp2_dp2():
    for parallel in ("dp=1", "pp=2,dp=2"):
        schedule = slimpack.plan(
            LENGTHS, model="tiny", cluster="h100-sxm", parallel=parallel, passes=SMALL_SLICES
        )
        assert continuation_slices(schedule) >= 30
        assert_exact(schedule)


def swapped_backward_packs(schedule):
    """The schedule with the first two backward packs of one sample's slices swapped in the op list."""
    document = json.loads(schedule.to_json())
    ops = document["devices"][0]["ops"]
    backward = [i for i, op in enumerate(ops) if op["op"] == "backward"]
    for a in backward:
        for b in backward:
            later = schedule.packs[ops[a]["pack"]]  # backwarded first: the later tokens
            earlier = schedule.packs[ops[b]["pack"]]
            if a < b and any(
                s1 == s2 and start2 == end1
                for s1, _, end1 in earlier.slice_keys()
                for s2, start2, _ in later.slice_keys()
            ):
                ops[a], ops[b] = ops[b], ops[a]
                return slimpack.Schedule(json.dumps(document))
    raise AssertionError("no two dependent backward packs")


def test_negative_control_swapped_backward_packs_is_caught():
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="h100-sxm", parallel="dp=1", passes=SMALL_SLICES)
    assert_exact(schedule)
    with pytest.raises(st.ScheduleOrderError, match="before the backward of its later tokens"):
        st.run(swapped_backward_packs(schedule))


def test_negative_control_missing_embedding_sync_is_caught():
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="h100-sxm", parallel="pp=2,dp=2", strategy="kk")
    assert schedule.model["tied_embeddings"]
    reference_loss, reference_grads = st.reference(schedule)
    step = st.run(schedule, options=st.Options(tied_embedding_sync=False))
    loss_error, (grad_error, where) = step_errors(step, reference_loss, reference_grads)
    assert loss_error <= TOLERANCE  # the forward is right ...
    assert grad_error > 0.1 and "embedding" in where  # ... the embedding's gradient is not
