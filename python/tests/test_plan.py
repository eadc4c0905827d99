"""slimpack.plan / Planner / Schedule: the Python API over the Rust planner."""

import json
from pathlib import Path

import numpy as np
import pytest

import slimpack

LENGTHS = [900, 300, 2500, 70, 1200, 4100, 650]


def test_plan_returns_int32_pack_metadata_metrics_and_its_json():
    schedule = slimpack.plan(
        LENGTHS, model="llama-7b", cluster="h100-sxm", parallel="tp=8,pp=2,dp=2", context=4096
    )
    assert schedule.world == 32
    assert schedule.metrics["step_time_s"] > 0
    assert schedule.candidate and schedule.candidates_tried >= 1
    assert schedule.tokens == sum(LENGTHS)
    assert len(schedule.sample_lengths) == len(LENGTHS) + 1  # 4100 is cut at the context
    for pack in schedule.packs:
        for array in (
            pack.cu_seqlens_q,
            pack.cu_seqlens_kv,
            pack.slices,
            pack.position_offsets,
            pack.position_ids,
        ):
            assert array.dtype == np.int32
        assert pack.cu_seqlens_q[0] == 0 and pack.cu_seqlens_q[-1] == pack.tokens
        assert len(pack.position_ids) == pack.tokens
        assert pack.max_seqlen_q == int(np.diff(pack.cu_seqlens_q_padded).max())
        owned = np.sort(
            np.concatenate(
                pack.positions_of(0)
                if pack.cp_size == 1
                else [np.concatenate(pack.positions_of(m)) for m in range(pack.cp_size)]
            )
        )
        assert len(owned) == pack.tokens  # the CP members' shares partition the pack's tokens
    # Every token is in exactly one forward pack and one backward pack.
    for direction in (schedule.forward_packs, schedule.backward_packs):
        assert sum(p.tokens for p in direction) == schedule.tokens
    document = json.loads(schedule.to_json())
    assert document["format"] == "slimpack.schedule" and document["predicted"] == schedule.metrics
    again = slimpack.Schedule.from_json(schedule.to_json())
    assert [p.slice_keys() for p in again.packs] == [p.slice_keys() for p in schedule.packs]
    assert {op["op"] for op in schedule.ops(0)} >= {"forward", "backward", "reduce_scatter"}


def test_every_strategy_plans():
    for strategy in slimpack.strategies():
        parallel = "pp=1,dp=2" if strategy == "hybrid-cp" else "pp=2,dp=2"
        schedule = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel=parallel, strategy=strategy)
        assert schedule.tokens <= sum(LENGTHS), strategy  # wlb may delay samples


def test_planner_plans_an_epoch_ahead_of_the_consumer_with_one_tuned_configuration():
    lengths = list(np.random.default_rng(7).integers(50, 6000, size=200))
    planner = slimpack.Planner(
        lengths,
        model="llama-7b",
        cluster="h100-sxm",
        parallel="tp=8,dp=4",
        global_batch=32,
        context=4096,
        seed=3,
        prefetch=2,
    )
    seen = []
    for schedule in planner:
        assert isinstance(schedule, slimpack.Schedule)
        seen.append(schedule.step)
        assert set(schedule.sample_documents.tolist()) <= set(range(len(lengths)))
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 6
    summary = planner.summary
    assert summary["steps"] == len(seen) and summary["candidate"]
    # The Planner's steps are `slimpack plan`'s: drawn without replacement over the epoch.
    assert summary["samples"] >= len(lengths)


def test_planner_reads_a_lengths_file_and_a_dataset_of_token_lists(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in LENGTHS) + "\n")
    steps = list(slimpack.Planner(str(path), model="tiny", cluster="cpu", parallel="dp=2", global_batch=3))
    assert steps and steps[0].sample_lengths.sum() > 0
    dataset = [[1] * n for n in (40, 7, 300, 12)]
    steps = list(slimpack.Planner(dataset, model="tiny", cluster="cpu", parallel="dp=1", global_batch=2))
    documents = sorted(d for s in steps for d in s.sample_documents.tolist())
    assert documents == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: slimpack.plan([10, 20], model="gpt-9"),
            "--model: unknown model preset 'gpt-9' (valid: tiny, llama-7b",
        ),
        (lambda: slimpack.plan([10, 20], cluster="tpu-v9"), "--cluster: unknown cluster preset 'tpu-v9'"),
        (
            lambda: slimpack.plan([10, 20], strategy="magic"),
            "--strategy: unknown strategy 'magic' (valid: padding",
        ),
        (
            lambda: slimpack.plan([10, 20], parallel="dp=0"),
            "--parallel: dp must be a positive integer, got 0",
        ),
        (lambda: slimpack.plan([]), "lengths: no documents: cannot draw a batch from an empty dataset"),
        (
            lambda: slimpack.plan([10, 0, 5]),
            "lengths: document 1 has length 0: every document needs at least 1 token",
        ),
        (lambda: slimpack.plan([3, -1]), "lengths: document 1: length -1 is negative"),
        (
            lambda: slimpack.plan([10], context=0),
            "--context: must be a positive number of tokens per sample, got 0",
        ),
        (
            lambda: slimpack.plan([10], memory_limit=1.5),
            "--memory-limit 1.5: give a fraction of device memory in (0, 1]",
        ),
        (lambda: slimpack.plan([10], passes="slice{size=8}"), "stops at phase"),
        (lambda: slimpack.Planner([5, 6], model="gpt-9"), "--model: unknown model preset 'gpt-9'"),
        (lambda: slimpack.Planner([5, 0]), "lengths: document 1 has length 0"),
        (
            lambda: slimpack.Planner([5, 6], global_batch=0),
            "--global-batch: must be a positive number of samples, got 0",
        ),
    ],
)
def test_bad_input_raises_value_error_with_the_command_lines_message(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_calibration_table_of_the_clusters_device_is_used_and_any_other_refused(tmp_path):
    # The shipped table of the `cpu` preset's device (the registry is process-wide, so this
    # test gives only the table the cpu cluster already uses).
    shipped = Path(__file__).resolve().parents[2] / "machine" / "calibration" / "cpu.json"
    plain = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="dp=2")
    calibrated = slimpack.plan(
        LENGTHS, model="tiny", cluster="cpu", parallel="dp=2", calibration=shipped
    )
    assert calibrated.metrics["step_time_s"] == plain.metrics["step_time_s"]
    for call, message in [
        (
            lambda: slimpack.plan([10], cluster="h100-sxm", model="llama-7b", calibration=shipped),
            "measured on 'cpu-2core'",
        ),
        (lambda: slimpack.plan([10], calibration=tmp_path / "none.json"), "none.json"),
        (lambda: slimpack.Planner([5, 6], calibration=tmp_path), str(tmp_path)),
    ]:
        with pytest.raises(ValueError) as error:
            call()
        assert message in str(error.value) and "\n" not in str(error.value)


def test_a_version_2_document_is_refused_with_one_line():
    import pathlib

    v2 = pathlib.Path(__file__).parents[2] / "codegen/tests/data/tiny-pp2-dp4.v2.schedule.json"
    with pytest.raises(
        ValueError, match=r"^schedule version 2 is not supported: this build reads and writes version 3 "
    ):
        slimpack.Schedule.from_json(v2.read_text())
    with pytest.raises(ValueError, match="unknown field `surprise`"):
        document = json.loads(slimpack.plan([5, 9]).to_json())
        document["packs"][0]["surprise"] = 1
        slimpack.Schedule.from_json(json.dumps(document))


def test_collectives_name_their_ranks_through_the_group_table():
    schedule = slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="tp=2,pp=2,dp=2")
    parallel = schedule.parallel
    tp, cp, dp = parallel["tp"], parallel["cp"], parallel["dp"]
    for rank in range(schedule.world):
        coords = schedule.coords(rank)
        sync = [op for op in schedule.ops(rank) if op["op"] in ("reduce_scatter", "all_gather")]
        assert len(sync) == 2
        # Every device of its stage with its tp coordinate, in rank order.
        expected = [
            coords["tp"] + tp * (c + cp * (d + dp * coords["pp"])) for d in range(dp) for c in range(cp)
        ]
        for op in sync:
            assert schedule.ranks(op) == expected
    # Each distinct group is listed once.
    groups = [tuple(g) for g in schedule.groups]
    assert len(groups) == len(set(groups))
    assert slimpack.schedule.group_ranks({"runs": [{"first": 1, "stride": 4, "count": 3}]}) == [1, 5, 9]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["devices"][0]["ops"][-1].update(group=10**6), "names group 1000000, but there are"),
        (lambda d: d["groups"][0]["runs"][0].update(first=10**6), "goes past rank"),
        (lambda d: d["groups"][0]["runs"][0].update(stride=0), "has stride 0"),
        (lambda d: d["groups"][0].update(runs=[]), "group 0 has no runs of ranks"),
    ],
)
def test_malformed_groups_are_one_line_value_errors(edit, message):
    document = json.loads(slimpack.plan(LENGTHS, model="tiny", cluster="cpu", parallel="pp=2,dp=2").to_json())
    edit(document)
    with pytest.raises(ValueError) as error:
        slimpack.Schedule.from_json(json.dumps(document))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_planning_releases_the_gil():
    import threading

    lengths = list(np.random.default_rng(1).integers(100, 30000, size=400))
    planner = threading.Thread(
        target=slimpack.plan,
        args=(lengths,),
        kwargs=dict(model="llama-7b", cluster="h100-sxm", parallel="tp=8,pp=2,dp=4"),
    )
    turns = 0
    planner.start()
    while planner.is_alive():
        turns += 1  # runs only while the planning thread does not hold the GIL
    planner.join()
    # With the GIL held for the whole plan this loop would get at most a few switch intervals.
    assert turns > 10_000, turns


def test_planner_feeds_a_dataloader():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    documents = [list(range(n)) for n in np.random.default_rng(2).integers(5, 400, size=40)]

    class PlannedSteps(IterableDataset):
        def __iter__(self):
            for schedule in slimpack.Planner(
                documents, model="tiny", cluster="cpu", parallel="dp=2", global_batch=8
            ):
                yield schedule, [documents[d] for d in schedule.sample_documents]

    steps = list(DataLoader(PlannedSteps(), batch_size=None))
    assert sum(len(samples) for _, samples in steps) == len(documents)
    for schedule, samples in steps:
        assert [len(s) for s in samples] == schedule.sample_lengths.tolist()
