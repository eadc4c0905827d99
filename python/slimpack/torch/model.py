"""The small Llama-style model `slimpack.torch` executes, and its unsliced reference step.

The semantics follow the Rust CPU runtime (runtime/src/cpu/): RMSNorm (eps 1e-5) before
attention and MLP, RoPE with base 10000 in the "rotate half" convention and the angle computed
from the absolute position in float64, causal grouped-query attention scaled by
1/sqrt(head_dim), a SwiGLU MLP, a final RMSNorm and an output projection (the transposed
embedding when `tied_embeddings`). Each sample predicts its own next tokens: position `p` has
target `tokens[p + 1]`, the last position none; the loss is the sum of the cross-entropies over
the whole batch divided by its number of predicted tokens (`sum(len - 1)`), so any split of
the work adds up to the same loss and gradients.

Parameters are a flat dict of tensors named like the CPU runtime's: `embedding`,
`layers.{i}.{attn_norm,wq,wk,wv,wo,mlp_norm,w_gate,w_up,w_down}`, `final_norm`, `output`
(untied models only). Projections are `[in, out]` (`y = x @ W`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

import torch
import torch.nn.functional as F

LAYER_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class ModelConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0

    @classmethod
    def from_spec(cls, model: Mapping) -> "ModelConfig":
        """The configuration of a schedule's `spec.model`."""
        return cls(
            layers=int(model["layers"]),
            hidden=int(model["hidden"]),
            heads=int(model["heads"]),
            kv_heads=int(model["kv_heads"]),
            head_dim=int(model["head_dim"]),
            ffn=int(model["ffn"]),
            vocab=int(model["vocab"]),
            tied_embeddings=bool(model.get("tied_embeddings", False)),
        )


def init_params(config: ModelConfig, seed: int = 0, dtype=torch.float64) -> Dict[str, torch.Tensor]:
    """Deterministic weights of the whole model (norm gains near 1, projections ~N(0, 1/in))."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, std):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * std).to(dtype)

    def gain(width):
        return (1.0 + 0.1 * torch.randn(width, generator=generator, dtype=torch.float64)).to(dtype)

    h, q, kv = config.hidden, config.heads * config.head_dim, config.kv_heads * config.head_dim
    params = {"embedding": normal(config.vocab, h, std=1.0)}
    for i in range(config.layers):
        layer = {
            "attn_norm": gain(h),
            "wq": normal(h, q, std=h**-0.5),
            "wk": normal(h, kv, std=h**-0.5),
            "wv": normal(h, kv, std=h**-0.5),
            "wo": normal(q, h, std=q**-0.5),
            "mlp_norm": gain(h),
            "w_gate": normal(h, config.ffn, std=h**-0.5),
            "w_up": normal(h, config.ffn, std=h**-0.5),
            "w_down": normal(config.ffn, h, std=config.ffn**-0.5),
        }
        params.update({f"layers.{i}.{name}": t for name, t in layer.items()})
    params["final_norm"] = gain(h)
    if not config.tied_embeddings:
        params["output"] = normal(config.vocab, h, std=h**-0.5)
    return params


def synthetic_tokens(lengths: Sequence[int], vocab: int, seed: int = 0) -> List[torch.Tensor]:
    """Uniformly random token ids for samples of the given lengths, deterministic in `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(n),), generator=generator) for n in lengths]


def predicted_tokens(tokens: Sequence[torch.Tensor]) -> int:
    """Tokens with a target over the batch: the loss's normalizer."""
    return sum(len(t) - 1 for t in tokens)


def targets(tokens: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Targets of positions `[start, end)` of a sample: the next token, -100 (none) at its end."""
    labels = torch.full((end - start,), -100, dtype=torch.long)
    stop = min(end, len(tokens) - 1)
    if stop > start:
        labels[: stop - start] = tokens[start + 1 : stop + 1]
    return labels


def rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotates `x` (`[rows, heads, head_dim]`); `positions[r]` is row `r`'s position in its sample."""
    half = x.shape[-1] // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    angle = positions.to(torch.float64)[:, None] * inv[None, :]
    cos = angle.cos().to(x.dtype)[:, None, :]
    sin = angle.sin().to(x.dtype)[:, None, :]
    lo, hi = x[..., :half], x[..., half:]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1)


def qkv(config: ModelConfig, p: Mapping[str, torch.Tensor], x: torch.Tensor, positions: torch.Tensor):
    """Queries, keys and values of rows `x` (RoPE applied to queries and keys)."""
    normed = rmsnorm(x, p["attn_norm"], config.norm_eps)
    q = (normed @ p["wq"]).view(-1, config.heads, config.head_dim)
    k = (normed @ p["wk"]).view(-1, config.kv_heads, config.head_dim)
    v = (normed @ p["wv"]).view(-1, config.kv_heads, config.head_dim)
    return rope(q, positions, config.rope_theta), rope(k, positions, config.rope_theta), v


def attention(config: ModelConfig, q, k, v, q_positions, k_positions) -> torch.Tensor:
    """Causal grouped-query attention of queries at `q_positions` over keys at `k_positions` of the
    same sample: query at position `p` sees the keys at positions `<= p` (for a continuation
    slice, the diagonal aligned bottom-right). Returns `[rows, heads * head_dim]`."""
    group = config.heads // config.kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(config.head_dim)
    allowed = k_positions[None, :] <= q_positions[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
    return out.reshape(-1, config.heads * config.head_dim)


def layer_rest(config: ModelConfig, p: Mapping[str, torch.Tensor], x, attended) -> torch.Tensor:
    """The layer after attention: output projection and residual, then the SwiGLU MLP."""
    h = x + attended @ p["wo"]
    normed = rmsnorm(h, p["mlp_norm"], config.norm_eps)
    return h + (F.silu(normed @ p["w_gate"]) * (normed @ p["w_up"])) @ p["w_down"]


def layer_params(params: Mapping[str, torch.Tensor], layer: int) -> Dict[str, torch.Tensor]:
    return {name: params[f"layers.{layer}.{name}"] for name in LAYER_TENSORS}


def head_loss(config: ModelConfig, final_norm, output, x, labels, normalizer: int) -> torch.Tensor:
    """The scaled loss of rows `x`: `sum(CE over rows with a target) / normalizer`."""
    logits = rmsnorm(x, final_norm, config.norm_eps) @ output.t()
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / normalizer


def reference_step(config: ModelConfig, params: Mapping[str, torch.Tensor], tokens: Sequence[torch.Tensor]):
    """The unsliced step: every sample whole, one autograd call. Returns `(loss, grads)`."""
    leaves = {name: t.detach().clone().requires_grad_(True) for name, t in params.items()}
    normalizer = predicted_tokens(tokens)
    output = leaves["embedding"] if config.tied_embeddings else leaves["output"]
    loss = torch.zeros((), dtype=leaves["embedding"].dtype)
    for sample in tokens:
        positions = torch.arange(len(sample))
        x = leaves["embedding"][sample]
        for layer in range(config.layers):
            p = layer_params(leaves, layer)
            q, k, v = qkv(config, p, x, positions)
            x = layer_rest(config, p, x, attention(config, q, k, v, positions, positions))
        loss = loss + head_loss(
            config, leaves["final_norm"], output, x, targets(sample, 0, len(sample)), normalizer
        )
    loss.backward()
    return loss.detach(), {name: t.grad for name, t in leaves.items()}
