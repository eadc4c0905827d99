"""Type stubs of the Rust extension (python/src/lib.rs); use the wrappers in `slimpack`."""

from typing import List, Optional, Sequence, Tuple

SCHEDULE_VERSION: int

def plan(
    lengths: Sequence[int],
    *,
    model: str,
    cluster: str,
    parallel: str,
    strategy: str = "slimpack",
    context: Optional[int] = None,
    recompute: Optional[str] = None,
    memory_limit: Optional[float] = None,
    tune_budget_ms: Optional[int] = None,
    passes: Optional[str] = None,
    verify: bool = True,
    model_chunks: bool = False,
    calibration: Optional[str] = None,
) -> Tuple[str, str, int]:
    """`(schedule_json, candidate, candidates_tried)`; raises ValueError on bad input."""

def strategies() -> List[str]: ...
def check_schedule(text: str) -> None:
    """Raises ValueError unless `text` is a schedule document this build reads."""

class EpochPlanner:
    def __init__(
        self,
        *,
        lengths: Optional[Sequence[int]] = None,
        path: Optional[str] = None,
        model: str,
        cluster: str,
        parallel: str,
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
        calibration: Optional[str] = None,
    ) -> None: ...
    def next(self) -> Optional[Tuple[int, str]]:
        """The next `(step, schedule_json)`, waiting without the GIL; None once done."""
    def summary(self) -> Optional[str]:
        """The plan's summary as JSON, once every step is planned."""
