"""slimpack: plan variable-length LLM training steps from Python, and run them in PyTorch.

- `plan(lengths, model=..., cluster=..., parallel=...)` compiles one global batch into a
  `Schedule` (per-rank ops, per-pack varlen metadata, the simulator's metrics);
- `Planner(lengths_or_dataset, ...)` iterates over the planned global batches of an epoch,
  planning the next step on a background thread while the current one trains;
- `slimpack.torch` runs a schedule exactly in PyTorch (a reference executor for a small
  Llama-style model, one process or one process per rank with torch.distributed).

Planning happens in Rust (the `slimpack` crate) with the GIL released. Bad input raises
`ValueError` carrying the command line's one-line message.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _native
from .schedule import Pack, Schedule

__all__ = ["plan", "Planner", "Schedule", "Pack", "strategies", "SCHEDULE_VERSION"]

#: The schedule JSON version this build reads and writes.
SCHEDULE_VERSION: int = _native.SCHEDULE_VERSION


def strategies() -> list:
    """Names of the strategies `plan` and `Planner` accept (slimpack, its ablations, the peers)."""
    return list(_native.strategies())


def _lengths(values: Iterable) -> list:
    """The lengths as Python ints (a list, a numpy array, a tensor); non-integers are bad input."""
    array = np.asarray(values if not hasattr(values, "tolist") else values.tolist())
    if array.ndim != 1:
        raise ValueError(f"lengths: expected a flat sequence of token counts, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
            array = array.astype(np.int64)
        else:
            raise ValueError("lengths: every length must be a whole number of tokens")
    return [int(v) for v in array]


def plan(
    lengths: Sequence[int],
    *,
    model: str = "tiny",
    cluster: str = "cpu",
    parallel: str = "dp=1",
    strategy: str = "slimpack",
    context: Optional[int] = None,
    recompute: Optional[str] = None,
    memory_limit: Optional[float] = None,
    tune_budget_ms: Optional[int] = None,
    passes: Optional[str] = None,
    verify: bool = True,
    model_chunks: bool = False,
    calibration: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Schedule:
    """Plans one global batch with one sample per length (documents longer than `context` are
    cut into context-length samples), as `slimpack compile --strategy STRATEGY` does: every
    candidate configuration of the strategy is compiled and simulated, and the fastest that fits
    `memory_limit` (a fraction of device memory, default 0.92) is kept.

    `model` and `cluster` are presets (`tiny`, `llama-7b`, ...; `cpu`, `h100-sxm`, ...),
    `parallel` a layout such as `"tp=8,pp=4,dp=4"`. `passes` runs an explicit pass pipeline
    instead of a strategy (`compile --passes`, e.g. `"assign-dp,slice{size=64},pack-fwd{cap=256},
    pack-bwd{cap=256},schedule-pipeline"`), untuned. A plan that does not fit device memory is
    returned all the same, with `schedule.metrics["oom"]` true (the command line exits 3).
    `model_chunks=True` lets a strategy choose interleaved 1F1B (`vpp=2` in
    `schedule.parallel`), which the trainer must then run with its layers in `pp · vpp` chunks
    (`slimpack.torch` runs one chunk per device). `calibration` is the path of a `slimpack
    calibrate` table measured on the cluster's device (`--calibration FILE`): from then on it
    prices that device's kernels for every plan of this process.
    """
    document, candidate, tried = _native.plan(
        _lengths(lengths),
        model=model,
        cluster=cluster,
        parallel=parallel,
        strategy=strategy,
        context=context,
        recompute=recompute,
        memory_limit=memory_limit,
        tune_budget_ms=tune_budget_ms,
        passes=passes,
        verify=verify,
        model_chunks=model_chunks,
        calibration=None if calibration is None else os.fspath(calibration),
    )
    return Schedule(document, candidate, tried)


class Planner(Iterator[Schedule]):
    """The planned global batches of one epoch, in step order (`slimpack plan`, as a data-loader
    component).

    `source` is a list of lengths, the path of a lengths file (text, JSON, JSONL), or a dataset
    whose items have a length (`len(dataset[i])` tokens). Global batches are drawn as
    `slimpack plan` draws them (`global_batch` samples or `global_batch_tokens` tokens, in a
    permutation seeded by `seed`, cut to `context`). The strategy is tuned on the first step and
    its configuration reused for the later ones (a step over the memory limit is re-tuned).

    A background thread plans up to `prefetch` steps ahead of the consumer, so step N+1 is
    planned while step N trains. Each item is a `Schedule` whose `step` attribute numbers it
    from 1 and whose `sample_documents` index `source`. `calibration` is as for `plan`.
    """

    def __init__(
        self,
        source: Union[Sequence[int], str, "os.PathLike[str]", Any],
        *,
        model: str = "tiny",
        cluster: str = "cpu",
        parallel: str = "dp=1",
        strategy: str = "slimpack",
        context: Optional[int] = None,
        global_batch: Optional[int] = None,
        global_batch_tokens: Optional[int] = None,
        seed: int = 0,
        recompute: Optional[str] = None,
        memory_limit: Optional[float] = None,
        max_steps: Optional[int] = None,
        prefetch: int = 1,
        verify: bool = True,
        model_chunks: bool = False,
        calibration: Optional[Union[str, "os.PathLike[str]"]] = None,
    ):
        lengths, path = None, None
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
        else:
            items = list(source) if not hasattr(source, "__getitem__") else source
            first = items[0] if len(items) else None
            if first is not None and hasattr(first, "__len__"):
                lengths = [len(items[i]) for i in range(len(items))]
            else:
                lengths = _lengths(items)
        self._native = _native.EpochPlanner(
            lengths=lengths,
            path=path,
            model=model,
            cluster=cluster,
            parallel=parallel,
            strategy=strategy,
            context=context,
            global_batch=global_batch,
            global_batch_tokens=global_batch_tokens,
            seed=seed,
            recompute=recompute,
            memory_limit=memory_limit,
            max_steps=max_steps,
            prefetch=prefetch,
            verify=verify,
            model_chunks=model_chunks,
            calibration=None if calibration is None else os.fspath(calibration),
        )

    def __iter__(self) -> "Planner":
        return self

    def __next__(self) -> Schedule:
        item = self._native.next()
        if item is None:
            raise StopIteration
        step, document = item
        schedule = Schedule(document)
        schedule.step = step
        return schedule

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        """The epoch plan's summary (`slimpack plan --report json`), once every step is planned."""
        text = self._native.summary()
        return None if text is None else json.loads(text)
