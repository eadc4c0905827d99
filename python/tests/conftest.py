"""Shared helpers of the Python package's tests."""

import pytest

torch = pytest.importorskip(
    "torch", reason="slimpack.torch tests need torch (scripts/setup-python.sh installs it)"
)


def relative_error(value, reference) -> float:
    """max |value - reference| / max |reference| (0 when both are zero)."""
    scale = float(reference.abs().max())
    diff = float((value - reference).abs().max())
    return diff / scale if scale > 0 else diff


def step_errors(step, reference_loss, reference_grads):
    """The loss's relative error and, over every rank and every tensor it holds, the largest
    gradient's relative error, with the tensor that has it."""
    loss_error = abs(step.loss - float(reference_loss)) / abs(float(reference_loss))
    worst = (0.0, None)
    for rank in step.ranks:
        assert set(rank.grads) <= set(reference_grads)
        for name, grad in rank.grads.items():
            worst = max(worst, (relative_error(grad, reference_grads[name]), f"rank {rank.rank} {name}"))
    covered = {name for rank in step.ranks for name in rank.grads}
    assert covered == set(reference_grads), f"tensors no rank holds: {set(reference_grads) - covered}"
    return loss_error, worst
