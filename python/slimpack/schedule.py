"""`Schedule` and `Pack`: a planned training step as Python objects.

A `Schedule` wraps one schedule JSON document (`slimpack compile --emit json`,
docs/schedule.schema.json, version 3): the spec, the samples, every pack with its varlen layout,
per global rank the ops in order, and the groups of ranks its collectives run over (each op
names one by index; `Schedule.ranks(op)` gives its ranks). Pack metadata comes as numpy int32 arrays (the dtype
FlashAttention and Megatron-Core want for `cu_seqlens`); `.metrics` is the simulator's report
of the step; `.to_json()` gives the document back unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _native


def group_ranks(group: Dict[str, Any]) -> List[int]:
    """The global ranks of one entry of the document's `groups`, in member order: its runs of
    `count` ranks from `first`, `stride` apart, one after the other."""
    return [
        run["first"] + i * run["stride"] for run in group["runs"] for i in range(run["count"])
    ]


def _int32(values) -> np.ndarray:
    array = np.asarray(values, dtype=np.int64)
    if array.size and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise ValueError(f"value out of the int32 range: {array.min()}..{array.max()}")
    return array.astype(np.int32)


@dataclass(frozen=True)
class Pack:
    """One MicroPack: its slices and the varlen (THD) metadata of its packed tensor.

    `slices[i] = (sample, start, end, kv_start)`: the pack's rows
    `cu_seqlens_q[i]:cu_seqlens_q[i+1]` are tokens `[start, end)` of `sample`; they attend
    causally (bottom-right aligned) to keys `[kv_start, end)` of the same sample, the earlier
    ones computed by earlier slices (a per-sample K/V cache). `cp_runs[i, m]` are the two
    `[start, end)` runs of positions CP member `m` owns of slice `i`. A forward pack's
    `sub_batches` are `(backward_pack, slice indices)`: its slices grouped by the backward pack
    that runs them.
    """

    index: int
    name: str
    direction: str
    replica: int
    dp_ranks: np.ndarray
    slices: np.ndarray
    slice_ids: np.ndarray
    cu_seqlens_q: np.ndarray
    cu_seqlens_kv: np.ndarray
    cu_seqlens_q_padded: np.ndarray
    cu_seqlens_kv_padded: np.ndarray
    max_seqlen_q: int
    max_seqlen_kv: int
    position_offsets: np.ndarray
    tokens: int
    padded_tokens: int
    cp_size: int
    cp_runs: np.ndarray
    sub_batches: List[Tuple[int, List[int]]]
    document: Dict[str, Any]

    @classmethod
    def from_document(cls, index: int, pack: Dict[str, Any]) -> "Pack":
        slices = pack["slices"]
        rows = [(s["sample"], s["start"], s["end"], s["kv_start"]) for s in slices]
        params = pack["packed_seq_params"]
        cp_size = int(pack["cp_size"])
        return cls(
            index=index,
            name=pack["name"],
            direction=pack["direction"],
            replica=pack["replica"],
            dp_ranks=_int32(pack["dp_ranks"]),
            slices=_int32(rows).reshape(len(rows), 4),
            slice_ids=_int32([s["slice"] for s in slices]),
            cu_seqlens_q=_int32(params["cu_seqlens_q"]),
            cu_seqlens_kv=_int32(params["cu_seqlens_kv"]),
            cu_seqlens_q_padded=_int32(params["cu_seqlens_q_padded"]),
            cu_seqlens_kv_padded=_int32(params["cu_seqlens_kv_padded"]),
            max_seqlen_q=int(params["max_seqlen_q"]),
            max_seqlen_kv=int(params["max_seqlen_kv"]),
            position_offsets=_int32(pack["position_offsets"]),
            tokens=int(pack["tokens"]),
            padded_tokens=int(pack["padded_tokens"]),
            cp_size=cp_size,
            cp_runs=_int32([s["cp_runs"] for s in slices]).reshape(len(slices), cp_size, 2, 2),
            sub_batches=[
                (int(b["backward_pack"]), [int(i) for i in b["slices"]]) for b in pack["sub_batches"]
            ],
            document=pack,
        )

    @property
    def is_forward(self) -> bool:
        return self.direction == "forward"

    @property
    def position_ids(self) -> np.ndarray:
        """Each real row's position in its sample (RoPE positions), int32."""
        return _int32(
            np.concatenate([np.arange(start, end) for _, start, end, _ in self.slices])
            if len(self.slices)
            else np.zeros(0)
        )

    def positions_of(self, member: int) -> List[np.ndarray]:
        """Per slice, the sample positions CP member `member` owns (all of them without CP)."""
        return [np.concatenate([np.arange(a, b) for a, b in runs]) for runs in self.cp_runs[:, member]]

    def slice_keys(self) -> List[tuple]:
        """`(sample, start, end)` of each slice: how forward and backward packs name a slice."""
        return [tuple(int(v) for v in row[:3]) for row in self.slices]


class Schedule:
    """A planned step (see the module documentation)."""

    def __init__(self, document: str, candidate: Optional[str] = None, candidates_tried: int = 0):
        _native.check_schedule(document)
        self._json = document
        self.document: Dict[str, Any] = json.loads(document)
        #: The configuration the tuning chose (e.g. `slimpack,cap=4096,...`), when planned here.
        self.candidate = candidate
        self.candidates_tried = candidates_tried
        self.packs: List[Pack] = [Pack.from_document(i, p) for i, p in enumerate(self.document["packs"])]
        #: Every slice: sample, start, end, forward and backward pack, targets, dK/dV order.
        self.slices: List[Dict[str, Any]] = self.document["slices"]
        samples = self.document["samples"]
        #: Length, source document and piece (of a document cut to the context) of each sample.
        self.sample_lengths = _int32([s["len"] for s in samples])
        self.sample_documents = np.asarray([s["doc"] for s in samples], dtype=np.int64)
        self.sample_pieces = _int32([s.get("piece", 0) for s in samples])
        self._groups: Dict[int, List[int]] = {}

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        """A schedule read from a document (`slimpack compile --emit json -o FILE`)."""
        return cls(text)

    def to_json(self) -> str:
        """The schedule document, exactly as planned."""
        return self._json

    @property
    def spec(self) -> Dict[str, Any]:
        return self.document["spec"]

    @property
    def model(self) -> Dict[str, Any]:
        return self.document["spec"]["model"]

    @property
    def parallel(self) -> Dict[str, int]:
        return self.document["spec"]["parallel"]

    @property
    def target_tokens(self) -> int:
        """What the loss is divided by: rows with a target in the whole global batch."""
        return int(self.document["loss"]["target_tokens"])

    @property
    def metrics(self) -> Dict[str, Any]:
        """The simulator's report of the step (step_time_s, tokens_per_s, peak memory, ...)."""
        return self.document.get("predicted") or {}

    @property
    def world(self) -> int:
        return len(self.document["devices"])

    @property
    def stages(self) -> List[Dict[str, int]]:
        """Pipeline stages: `first_layer` and `layers` of each."""
        return self.document["stages"]

    @property
    def replicas(self) -> List[List[int]]:
        """DP ranks of each replica (two or more: a DP-Merge group); see also `cp_size` there."""
        return [r["dp_ranks"] for r in self.document["replicas"]]

    def ops(self, rank: int) -> List[Dict[str, Any]]:
        """The ops of global rank `rank`, in order (`{"op": "forward", "pack": 3}`, ...)."""
        return self.document["devices"][rank]["ops"]

    def coords(self, rank: int) -> Dict[str, int]:
        return self.document["devices"][rank]["coords"]

    def group(self, index: int) -> List[int]:
        """The global ranks of group `index` of the document's `groups`, in member order."""
        if index not in self._groups:
            self._groups[index] = group_ranks(self.document["groups"][index])
        return self._groups[index]

    @property
    def groups(self) -> List[List[int]]:
        """Every group of ranks the schedule's collectives run over, in the document's order:
        creating one process group per entry in this order (on every process) gives each
        collective its communicator."""
        return [self.group(i) for i in range(len(self.document["groups"]))]

    def ranks(self, op: Dict[str, Any]) -> List[int]:
        """The global ranks a collective op (`cp_exchange`, `tied_embedding_all_reduce`,
        `reduce_scatter`, `all_gather`) runs over, in member order."""
        return self.group(op["group"])

    @property
    def forward_packs(self) -> List[Pack]:
        return [p for p in self.packs if p.is_forward]

    @property
    def backward_packs(self) -> List[Pack]:
        return [p for p in self.packs if not p.is_forward]

    @property
    def tokens(self) -> int:
        return int(self.sample_lengths.sum(dtype=np.int64))

    def packed_seq_params(self, pack, device=None):
        """Megatron-Core's `PackedSeqParams` (THD format) of `pack` (a `Pack` or its index):
        int32 `cu_seqlens_q/kv` and their `_padded` variants, `max_seqlen_q/kv`.

        The document's `packed_seq_params`, field for field. `cu_seqlens_kv` describes the K/V
        rows each slice attends to (its sample's prefix and itself), which a per-sample K/V
        cache provides (see `slimpack.torch`); Megatron's own packed path builds K/V from the
        pack's rows only, which is right for packs without continuation slices. Needs
        megatron-core (and torch) installed.
        """
        try:
            import torch
            from megatron.core.packed_seq_params import PackedSeqParams
        except ImportError as error:  # pragma: no cover - exercised where megatron is absent
            raise ImportError("packed_seq_params needs megatron-core: pip install megatron-core") from error
        if not isinstance(pack, Pack):
            pack = self.packs[int(pack)]

        def tensor(array: np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32)).to(device or "cpu")

        params = pack.document["packed_seq_params"]
        return PackedSeqParams(
            qkv_format=params["qkv_format"],
            cu_seqlens_q=tensor(pack.cu_seqlens_q),
            cu_seqlens_kv=tensor(pack.cu_seqlens_kv),
            cu_seqlens_q_padded=tensor(pack.cu_seqlens_q_padded),
            cu_seqlens_kv_padded=tensor(pack.cu_seqlens_kv_padded),
            max_seqlen_q=pack.max_seqlen_q,
            max_seqlen_kv=pack.max_seqlen_kv,
        )

    def __repr__(self) -> str:
        m = self.metrics
        return (
            f"Schedule({len(self.sample_lengths)} samples, {self.tokens} tokens, "
            f"{len(self.forward_packs)} forward / {len(self.backward_packs)} backward packs, "
            f"world {self.world}, predicted {m.get('step_time_s', float('nan')):.4g} s)"
        )
