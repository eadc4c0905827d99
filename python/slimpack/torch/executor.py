"""The reference executor: one schedule, run exactly, in PyTorch.

Each global rank follows its op list (`Schedule.ops(rank)`) in order:

- `forward p`: the pack's slices run as *sub-batches along the backward packs*: the slices of
  `p` that share a backward pack form one group, computed as one graph (their rows batched in
  the linear layers). Attention reads a per-sample, per-layer K/V cache: a slice appends its
  own K/V rows (RoPE at their absolute positions) and attends, bottom-right causal, to the
  cached rows `[kv_start, end)` of its sample. A cached chunk is read through the graph when
  reader and writer are in the same backward pack, and otherwise through a leaf copy whose
  `.grad` accumulates the dK/dV of the later slices.
- `backward p`: one `torch.autograd.backward` call over the pack's groups: their outputs (the
  scaled loss on the last stage, the received output gradient elsewhere) and the K/V of their
  slices with the accumulated dK/dV of the leaves as gradients. Afterwards the slices' cached
  K/V and the groups' graphs are freed: every later slice of their samples has been
  backwarded (per sample, backward runs in decreasing slice order).
- `send` / `recv`: a pack's activations (forward) or input gradients (backward), the pack's
  rows in slice order. Sends are non-blocking (`isend`, completed at the end of the step);
  receives block.
- `cp_exchange`: a pack of a CP group (a static CP degree, a DP-Merge group, or both) runs on
  each member with the positions the document gives it (`cp_runs`); the members all-gather
  each slice's K/V per layer inside the forward, and all-reduce the K/V gradients inside the
  backward, so the op itself only marks where the exchange happens.
- `tied_embedding_all_reduce`: the input embedding's gradient (first stage) and its copy's in
  the output projection (last stage) summed between the two.
- `reduce_scatter`: the stage's gradients summed over its DP and CP peers (an all-reduce:
  ZeRO's reduce-scatter followed by the all-gather of the update gives every rank the same
  values).
- `optimizer`, `all_gather`: no-ops here: the executor stops at the gradients, which is what it
  checks.

The groups of a forward pack, each slice's backward pack and the CP split are read from the
schedule (version 3: `sub_batches`, `slices`, `cp_runs`), as is the loss normalizer
(`loss.target_tokens`). Multi-rank schedules run one process per rank with torch.distributed
(gloo, CPU): `run()` spawns them. Only `tp=1` is executed (TP shards the layers' matrices,
which this reference does not model).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .model import (
    ModelConfig,
    attention,
    head_loss,
    init_params,
    layer_params,
    layer_rest,
    predicted_tokens,
    qkv,
    synthetic_tokens,
    targets,
)

SliceKey = Tuple[int, int, int]


class ScheduleOrderError(RuntimeError):
    """The schedule runs a backward before what it depends on (a negative control's schedule)."""


@dataclass
class Options:
    """Switches of the executor; the defaults run the schedule as it says."""

    #: Sum the tied embedding's gradient between the first and the last stage before the
    #: optimizer (off: the negative control a test must catch).
    tied_embedding_sync: bool = True


@dataclass
class RankResult:
    """What one rank computed."""

    rank: int
    stage: int
    dp: int
    #: This rank's share of the loss (its rows' scaled cross-entropy; 0 off the last stage).
    loss: float
    #: Gradients of the stage's parameters after the schedule's syncs.
    grads: Dict[str, torch.Tensor]
    #: Most K/V rows cached at once (over layers), and what was left at the end (must be 0).
    peak_kv_rows: int
    leftover: Dict[str, int]


@dataclass
class StepResult:
    """A whole step: the loss, the gradient of every parameter, and each rank's result."""

    loss: float
    grads: Dict[str, torch.Tensor]
    ranks: List[RankResult]


class _GatherRows(torch.autograd.Function):
    """All-gather of one slice's K/V rows in a CP group: each member's rows placed at their
    positions; the backward sums the members' gradients and returns this member's rows."""

    @staticmethod
    def forward(ctx, local, positions, member, group, length):
        most = max(len(p) for p in positions)
        padded = local.new_zeros((most,) + tuple(local.shape[1:]))
        padded[: len(local)] = local
        gathered = [torch.empty_like(padded) for _ in positions]
        dist.all_gather(gathered, padded, group=group)
        full = local.new_zeros((length,) + tuple(local.shape[1:]))
        for rows, index in zip(gathered, positions):
            full[index] = rows[: len(index)]
        ctx.positions, ctx.member, ctx.group = positions, member, group
        return full

    @staticmethod
    def backward(ctx, grad):
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return total[ctx.positions[ctx.member]], None, None, None, None


@dataclass
class _Chunk:
    """One slice's K/V at one layer in the cache: `kv` `[rows, 2, kv_heads, head_dim]`."""

    start: int
    end: int
    kv: torch.Tensor
    backward_pack: int
    leaf: Optional[torch.Tensor] = None

    def read(self, backward_pack: int) -> torch.Tensor:
        if backward_pack == self.backward_pack:
            return self.kv
        if self.leaf is None:
            self.leaf = self.kv.detach().requires_grad_(True)
        return self.leaf


@dataclass
class _Group:
    """The slices of one forward pack that share a backward pack, computed as one graph."""

    forward_pack: int
    backward_pack: int
    slices: List[int]  # indices into the forward pack's slices
    input_leaf: Optional[torch.Tensor] = None
    output: Optional[torch.Tensor] = None  # hidden rows (not last stage) or the scaled loss
    rows: List[int] = field(default_factory=list)  # this rank's rows per slice


class RankExecutor:
    """Runs the ops of one global rank (see the module documentation)."""

    def __init__(
        self,
        schedule,
        params: Mapping[str, torch.Tensor],
        tokens: Sequence[torch.Tensor],
        rank: int = 0,
        options: Optional[Options] = None,
        groups=None,
    ):
        self.schedule, self.rank, self.options = schedule, rank, options or Options()
        parallel = schedule.parallel
        if parallel["tp"] != 1:
            raise ValueError(f"slimpack.torch runs tp=1 schedules, got tp={parallel['tp']}")
        if parallel.get("vpp", 1) != 1:
            raise ValueError(
                f"slimpack.torch runs one model chunk per device, got vpp={parallel['vpp']} "
                "(plan without model_chunks=True)"
            )
        self.config = ModelConfig.from_spec(schedule.model)
        coords = schedule.coords(rank)
        self.dp, self.stage, self.cp = coords["dp"], coords["pp"], coords["cp"]
        self.dp_size, self.pp_size, self.cp_degree = parallel["dp"], parallel["pp"], parallel["cp"]
        stage = schedule.stages[self.stage]
        self.layers = range(stage["first_layer"], stage["first_layer"] + stage["layers"])
        self.first, self.last = self.stage == 0, self.stage == self.pp_size - 1
        self.leaves = {
            name: params[name].detach().clone().requires_grad_(True) for name in self._stage_tensors(params)
        }
        self.tokens = tokens
        self.normalizer = schedule.target_tokens
        if self.normalizer != predicted_tokens(tokens):
            raise ValueError(
                f"the schedule's loss counts {self.normalizer} target tokens, the tokens given hold {predicted_tokens(tokens)}"
            )
        self.backward_pack_of: Dict[SliceKey, int] = {
            (s["sample"], s["start"], s["end"]): s["backward_pack"] for s in schedule.slices
        }
        self.groups = groups or {}
        self.cache: Dict[Tuple[int, int], List[_Chunk]] = {}
        self.live: Dict[int, List[_Group]] = {}  # backward pack -> its groups
        self.outbox: Dict[Tuple[str, int], torch.Tensor] = {}
        self.mailbox: Dict[Tuple[str, int], torch.Tensor] = {}
        self.pending: List = []
        self._backwarded_from: set = set()
        self.loss = 0.0
        self.kv_rows = self.peak_kv_rows = 0

    def _stage_tensors(self, params) -> List[str]:
        names = [n for n in params if n.startswith("layers.") and int(n.split(".")[1]) in self.layers]
        if self.first or (self.last and self.config.tied_embeddings):
            names.append("embedding")
        if self.last:
            names.append("final_norm")
            if not self.config.tied_embeddings:
                names.append("output")
        return names

    def rank_of(self, dp: int, pp: int, cp: int) -> int:
        return cp + self.cp_degree * (dp + self.dp_size * pp)

    # ---- shares of a pack's tokens ----

    def _member(self, pack) -> int:
        """This rank's CP member index in `pack`'s group: `i * cp + c` for the `i`-th DP rank."""
        return [int(r) for r in pack.dp_ranks].index(self.dp) * self.cp_degree + self.cp

    def _positions(self, pack) -> List[torch.Tensor]:
        return [torch.from_numpy(p).long() for p in pack.positions_of(self._member(pack))]

    def _cp_group(self, pack):
        """`(process group, members in group-rank order, this rank's index there)`, or None."""
        if pack.cp_size == 1:
            return None
        members = [
            self.rank_of(int(pack.dp_ranks[m // self.cp_degree]), self.stage, m % self.cp_degree)
            for m in range(pack.cp_size)
        ]
        order = sorted(range(pack.cp_size), key=lambda m: members[m])  # torch orders a group by rank
        return self.groups[tuple(sorted(members))], order, order.index(self._member(pack))

    # ---- ops ----

    def run(self) -> RankResult:
        for op in self.schedule.ops(self.rank):
            kind = op["op"]
            handler = getattr(self, f"op_{kind}", None)
            if handler is None:
                raise ValueError(f"rank {self.rank}: unknown op '{kind}' in the schedule")
            handler(op)
        for work, _ in self.pending:
            work.wait()
        leftover = {
            "kv_chunks": sum(len(c) for c in self.cache.values()),
            "groups": sum(len(g) for g in self.live.values()),
            "messages": len(self.mailbox) + len(self.outbox),
        }
        grads = {}
        for name, leaf in self.leaves.items():
            grads[name] = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        return RankResult(self.rank, self.stage, self.dp, self.loss, grads, self.peak_kv_rows, leftover)

    def op_forward(self, op):
        pack = self.schedule.packs[op["pack"]]
        keys = pack.slice_keys()
        positions = self._positions(pack)
        rows = [len(p) for p in positions]
        groups = [_Group(pack.index, backward, list(slices)) for backward, slices in pack.sub_batches]
        offsets = [0]
        for n in rows:
            offsets.append(offsets[-1] + n)
        received = None if self.first else self.mailbox.pop(("forward", pack.index))
        hidden = {}
        for g in groups:
            g.rows = [rows[i] for i in g.slices]
            if self.first:
                ids = torch.cat([self.tokens[keys[i][0]][positions[i]] for i in g.slices])
                hidden[id(g)] = self.leaves["embedding"][ids]
            else:
                part = torch.cat([received[offsets[i] : offsets[i + 1]] for i in g.slices])
                g.input_leaf = part.detach().requires_grad_(True)
                hidden[id(g)] = g.input_leaf
        cp_group = self._cp_group(pack)
        for layer in self.layers:
            p = layer_params(self.leaves, layer)
            queries = {}
            for g in groups:
                pos = torch.cat([positions[i] for i in g.slices])
                q, k, v = qkv(self.config, p, hidden[id(g)], pos)
                kv = torch.stack([k, v], dim=1)
                at = 0
                for i, n in zip(g.slices, g.rows):
                    sample, start, end = keys[i]
                    own = kv[at : at + n]
                    queries[i] = q[at : at + n]
                    at += n
                    if cp_group is not None:
                        handle, order, me = cp_group
                        runs = pack.cp_runs[i]
                        owned = [torch.cat([torch.arange(a, b) for a, b in runs[m]]) - start for m in order]
                        own = _GatherRows.apply(own, owned, me, handle, end - start)
                    self.cache.setdefault((sample, layer), []).append(
                        _Chunk(start, end, own, g.backward_pack)
                    )
                    self.kv_rows += end - start
            self.peak_kv_rows = max(self.peak_kv_rows, self.kv_rows)
            for g in groups:
                attended = []
                for i in g.slices:
                    sample, start, end = keys[i]
                    kv_start = int(pack.slices[i][3])
                    parts, kpos = [], []
                    for chunk in self.cache[(sample, layer)]:
                        lo, hi = max(chunk.start, kv_start), min(chunk.end, end)
                        if lo < hi:
                            parts.append(chunk.read(g.backward_pack)[lo - chunk.start : hi - chunk.start])
                            kpos.append(torch.arange(lo, hi))
                    kv = torch.cat(parts)
                    attended.append(
                        attention(self.config, queries[i], kv[:, 0], kv[:, 1], positions[i], torch.cat(kpos))
                    )
                hidden[id(g)] = layer_rest(self.config, p, hidden[id(g)], torch.cat(attended))
        if self.last:
            output = self.leaves["embedding" if self.config.tied_embeddings else "output"]
            for g in groups:
                labels = torch.cat(
                    [
                        targets(self.tokens[keys[i][0]], 0, int(self.schedule.sample_lengths[keys[i][0]]))[
                            positions[i]
                        ]
                        for i in g.slices
                    ]
                )
                g.output = head_loss(
                    self.config, self.leaves["final_norm"], output, hidden[id(g)], labels, self.normalizer
                )
                self.loss += float(g.output.detach())
        else:
            out = [None] * len(keys)
            for g in groups:
                g.output = hidden[id(g)]
                at = 0
                for i, n in zip(g.slices, g.rows):
                    out[i] = g.output[at : at + n].detach()
                    at += n
            self.outbox[("forward", pack.index)] = (
                torch.cat(out).contiguous() if out else torch.zeros(0, self.config.hidden)
            )
        for g in groups:
            self.live.setdefault(g.backward_pack, []).append(g)

    def op_backward(self, op):
        pack = self.schedule.packs[op["pack"]]
        keys = pack.slice_keys()
        self._check_backward_order(pack)
        groups = self.live.pop(pack.index, [])
        roots, grads = [], []
        if self.last:
            for g in groups:
                roots.append(g.output)
                grads.append(torch.ones_like(g.output))
        else:
            received = self.mailbox.pop(("backward", pack.index))
            at, rows_of = 0, {}
            for key, n in zip(keys, [len(p) for p in self._positions(pack)]):
                rows_of[key] = received[at : at + n]
                at += n
            for g in groups:
                fpack = self.schedule.packs[g.forward_pack].slice_keys()
                roots.append(g.output)
                grads.append(torch.cat([rows_of[fpack[i]] for i in g.slices]))
        mine = set(keys)
        for layer in self.layers:
            for key in keys:
                for chunk in self.cache.get((key[0], layer), []):
                    if (key[0], chunk.start, chunk.end) == key and chunk.leaf is not None:
                        roots.append(chunk.kv)
                        grads.append(
                            chunk.leaf.grad if chunk.leaf.grad is not None else torch.zeros_like(chunk.kv)
                        )
        if roots:
            torch.autograd.backward(roots, grads)
        if not self.first:
            grad_of = {}
            for g in groups:
                fpack = self.schedule.packs[g.forward_pack].slice_keys()
                at = 0
                for i, n in zip(g.slices, g.rows):
                    grad_of[fpack[i]] = g.input_leaf.grad[at : at + n]
                    at += n
            self.outbox[("backward", pack.index)] = torch.cat([grad_of[k] for k in keys]).contiguous()
        for (sample, _layer), chunks in self.cache.items():
            kept = [c for c in chunks if (sample, c.start, c.end) not in mine]
            self.kv_rows -= sum(c.end - c.start for c in chunks if (sample, c.start, c.end) in mine)
            chunks[:] = kept
        self.cache = {k: v for k, v in self.cache.items() if v}

    def _check_backward_order(self, pack):
        """A slice's backward needs the dK/dV of every later slice of its sample: each of them
        must have been forwarded and backwarded (its K/V freed) already, on this stage."""
        keys = set(pack.slice_keys())
        # Slices of one sample in the same backward pack are one autograd call: their K/V is
        # read through the graph, so the later one's dK/dV reaches the earlier one within it.
        starts = {(sample, start) for sample, start, _ in keys}
        for sample, start, end in keys:
            done = (sample, end) in self._backwarded_from or (sample, end) in starts
            if end < int(self.schedule.sample_lengths[sample]) and not done:
                raise ScheduleOrderError(
                    f"rank {self.rank}: backward pack {pack.index} runs sample {sample} [{start}, {end}) "
                    f"before the backward of its later tokens (from {end}): their dK/dV would be lost"
                )
            if (sample, self.layers[0]) not in self.cache or not any(
                c.start == start and c.end == end for c in self.cache[(sample, self.layers[0])]
            ):
                raise ScheduleOrderError(
                    f"rank {self.rank}: backward pack {pack.index} runs sample {sample} [{start}, {end}) "
                    f"before its forward"
                )
        self._backwarded_from.update((sample, start) for sample, start, _ in keys)

    def op_cp_exchange(self, op):
        """A marker: the exchange runs inside the pack's forward and backward (see module docs)."""

    def _rows_of(self, pack) -> int:
        return sum(len(p) for p in self._positions(pack))

    def op_send(self, op):
        tensor = self.outbox.pop((op["direction"], op["pack"]))
        # The tensor stays referenced until its send completed.
        self.pending.append((dist.isend(tensor, dst=op["to"], tag=_tag(op)), tensor))

    def op_recv(self, op):
        pack = self.schedule.packs[op["pack"]]
        tensor = torch.empty(
            self._rows_of(pack), self.config.hidden, dtype=self.leaves[next(iter(self.leaves))].dtype
        )
        dist.recv(tensor, src=op["from"], tag=_tag(op))
        self.mailbox[(op["direction"], op["pack"])] = tensor

    def _all_reduce_grads(self, names, ranks):
        group = self.groups[tuple(sorted(int(r) for r in ranks))]
        for name in names:
            leaf = self.leaves[name]
            if leaf.grad is None:
                leaf.grad = torch.zeros_like(leaf)
            dist.all_reduce(leaf.grad, group=group)

    def op_reduce_scatter(self, op):
        for work, _ in self.pending:
            work.wait()
        self.pending = []
        ranks = self.schedule.ranks(op)
        if len(ranks) > 1:
            self._all_reduce_grads(list(self.leaves), ranks)

    def op_tied_embedding_all_reduce(self, op):
        if self.options.tied_embedding_sync:
            self._all_reduce_grads(["embedding"], self.schedule.ranks(op))

    def op_optimizer(self, op):
        """The executor stops at the gradients (see the module documentation)."""

    def op_all_gather(self, op):
        """Parameters are unchanged (no optimizer step here), so nothing to gather."""


def _tag(op) -> int:
    return 2 * int(op["pack"]) + (0 if op["direction"] == "forward" else 1)


def process_groups(schedule) -> List[Tuple[int, ...]]:
    """Every rank set a collective of the schedule runs over (the document's `groups` of more
    than one rank, as sorted tuples: torch orders a group by rank), in one order for all
    processes."""
    return sorted({tuple(sorted(ranks)) for ranks in schedule.groups if len(ranks) > 1})


def _worker(rank: int, world: int, job_dir: str) -> None:
    """One rank of a multi-rank `run`: reads the job, executes, writes its result (or error)."""
    from ..schedule import Schedule

    torch.set_num_threads(1)
    job = torch.load(os.path.join(job_dir, "job.pt"), weights_only=False)
    init = f"file://{os.path.join(job_dir, 'rendezvous')}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        schedule = Schedule.from_json(job["schedule"])
        groups = {ranks: dist.new_group(list(ranks)) for ranks in process_groups(schedule)}
        try:
            outcome = RankExecutor(schedule, job["params"], job["tokens"], rank, job["options"], groups).run()
        except Exception as error:  # handed to the parent, which raises it
            outcome = error
        torch.save(outcome, os.path.join(job_dir, f"rank{rank}.pt"))
        if isinstance(outcome, Exception):
            os._exit(3)  # peers may wait on this rank forever: the parent ends them
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_processes(schedule, params, tokens, options) -> List[RankResult]:
    """One process per rank (`python -m slimpack.torch.executor`, so the caller's script is not
    re-imported as multiprocessing's spawn would); a rank's exception is raised here."""
    import subprocess
    import sys
    import time

    world = schedule.world
    with tempfile.TemporaryDirectory() as job_dir:
        torch.save(
            {
                "schedule": schedule.to_json(),
                "params": dict(params),
                "tokens": list(tokens),
                "options": options,
            },
            os.path.join(job_dir, "job.pt"),
        )
        logs = [open(os.path.join(job_dir, f"rank{r}.log"), "w+") for r in range(world)]
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "slimpack.torch.executor", str(r), str(world), job_dir],
                stdout=logs[r],
                stderr=subprocess.STDOUT,
            )
            for r in range(world)
        ]
        try:
            while any(p.poll() is None for p in processes):
                if any(p.poll() not in (None, 0) for p in processes):
                    break
                time.sleep(0.05)
        finally:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                p.wait()
        outcomes = []
        for r in range(world):
            path = os.path.join(job_dir, f"rank{r}.pt")
            outcome = torch.load(path, weights_only=False) if os.path.exists(path) else None
            if isinstance(outcome, Exception):
                raise outcome
            if outcome is None or processes[r].returncode != 0:
                logs[r].seek(0)
                lines = [line for line in logs[r].read().splitlines() if line.strip()]
                tail = lines[-1] if lines else f"exit status {processes[r].returncode}"
                raise RuntimeError(f"rank {r} of {world} failed: {tail}")
            outcomes.append(outcome)
        for log in logs:
            log.close()
        return outcomes


def run(
    schedule,
    params: Optional[Mapping[str, torch.Tensor]] = None,
    tokens: Optional[Sequence[torch.Tensor]] = None,
    *,
    seed: int = 0,
    dtype=torch.float64,
    options: Optional[Options] = None,
) -> StepResult:
    """Runs `schedule` on the tiny model: in this process for one rank, else one process per
    rank (gloo). `params` default to `init_params(seed)`, `tokens` to random tokens of the
    schedule's sample lengths. Returns the loss and every parameter's gradient."""
    config = ModelConfig.from_spec(schedule.model)
    params = params if params is not None else init_params(config, seed, dtype)
    tokens = (
        tokens
        if tokens is not None
        else synthetic_tokens(schedule.sample_lengths.tolist(), config.vocab, seed)
    )
    if schedule.world == 1:
        results = [RankExecutor(schedule, params, tokens, 0, options).run()]
    else:
        results = _run_processes(schedule, params, tokens, options)
    return _assemble(results)


def _assemble(results: List[RankResult]) -> StepResult:
    loss = sum(r.loss for r in results)
    grads: Dict[str, torch.Tensor] = {}
    for r in sorted(results, key=lambda r: (r.dp, r.stage)):
        for name, grad in r.grads.items():
            grads.setdefault(name, grad)
    return StepResult(loss, grads, results)


if __name__ == "__main__":
    import sys

    # Through the package, so that what the rank pickles names `slimpack.torch.executor`.
    from slimpack.torch.executor import _worker as worker

    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
