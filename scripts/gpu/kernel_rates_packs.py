"""Packs of equal-length causal sequences (16K tokens per pack: B sequences of L) and continuation
slices (L queries after a prefix, bottom-right causal), through SDPA's backends; writes kernels2.json (into $OUT where set)."""
import json, os
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.nn.attention.bias import causal_lower_right

from kernel_rates import timed

dev = "cuda"
print(torch.__version__, torch.cuda.get_device_name(0), flush=True)


def measure(B, Lq, Lk, backend, mask):
    h, d = 8, 128
    q = torch.randn(B, h, Lq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, h, Lk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, h, Lk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    prefix = Lk - Lq
    pairs = Lq * prefix + Lq * (Lq + 1) / 2
    flops = 4 * d * h * B * pairs
    kw = {"is_causal": True} if mask is None else {"attn_mask": mask}
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        g = torch.randn_like(o)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
        def fb():
            y = F.scaled_dot_product_attention(q, k, v, **kw)
            torch.autograd.grad(y, (q, k, v), g)
        both = timed(fb)
    return {"backend": str(backend).split(".")[-1], "batch": B, "queries": Lq, "prefix": prefix,
            "forward_flops_per_s": flops / fwd, "backward_flops_per_s": 2.5 * flops / (both - fwd),
            "forward_s": fwd, "backward_s": both - fwd}


out = {"device": torch.cuda.get_device_name(0), "packs": [], "continuation": []}
for backend in [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]:
    for L in [256, 512, 1024, 2048, 4096, 8192, 16384]:
        try:
            row = measure(16384 // L, L, L, backend, None)
            out["packs"].append(row); print("pack", row, flush=True)
        except Exception as err:
            print("pack", backend, L, "failed", repr(err)[:160], flush=True)
for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]:
    for Lq, prefix in [(8192, 0), (8192, 8192), (8192, 24576), (8192, 57344), (16384, 114688), (32768, 98304)]:
        try:
            mask = causal_lower_right(Lq, Lq + prefix)
            row = measure(1, Lq, Lq + prefix, backend, mask)
            out["continuation"].append(row); print("cont", row, flush=True)
        except Exception as err:
            print("cont", backend, Lq, prefix, "failed", repr(err)[:160], flush=True)
            break
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "kernels2.json"), "w"), indent=1)
