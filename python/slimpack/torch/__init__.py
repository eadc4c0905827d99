"""`slimpack.torch`: run a slimpack schedule exactly in PyTorch.

A reference executor for a small Llama-style model (the CPU runtime's `tiny` semantics, see
`slimpack.torch.model`): forward packs with a per-sample K/V cache and position-aware RoPE,
backward packs as separate autograd calls with dK/dV accumulation, memory freed when the
schedule's order allows, and, for multi-rank schedules, one process per rank with
torch.distributed (gloo): pipeline stages, DP replicas, DP-Merge groups, the DP gradient sync
and the tied-embedding sync (see `slimpack.torch.executor`).

    import slimpack, slimpack.torch
    schedule = slimpack.plan([900, 300, 2500], model="tiny", cluster="cpu", parallel="dp=1")
    step = slimpack.torch.run(schedule)                 # loss and every gradient, fp64
    ref_loss, ref_grads = slimpack.torch.reference(schedule)
"""

from .executor import Options, RankExecutor, RankResult, ScheduleOrderError, StepResult, run
from .model import ModelConfig, init_params, reference_step, synthetic_tokens

__all__ = [
    "run",
    "reference",
    "Options",
    "RankExecutor",
    "RankResult",
    "StepResult",
    "ScheduleOrderError",
    "ModelConfig",
    "init_params",
    "reference_step",
    "synthetic_tokens",
]


def reference(schedule, params=None, tokens=None, *, seed: int = 0):
    """The unsliced step of the schedule's batch (same defaults as `run`): `(loss, grads)`."""
    import torch

    config = ModelConfig.from_spec(schedule.model)
    params = params if params is not None else init_params(config, seed, torch.float64)
    tokens = (
        tokens
        if tokens is not None
        else synthetic_tokens(schedule.sample_lengths.tolist(), config.vocab, seed)
    )
    return reference_step(config, params, tokens)
