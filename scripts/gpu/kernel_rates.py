"""Times the kernels slimpack's machine model prices (bf16 GEMMs of a llama-70b TP=8 rank, causal
attention through PyTorch's SDPA backends) at several token counts; writes kernels.json (into $OUT where set)."""
import json, os, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

torch.backends.cuda.matmul.allow_tf32 = False


def timed(fn, warm=3, iters=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters / 1e3


def main():
    dev = "cuda"
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "gemm": [], "attention": []}
    # llama-70b, TP=8 shards: (K, N) of qkv, o, gate+up, down.
    shapes = [(8192, 1280), (1024, 8192), (8192, 7168), (3584, 8192)]
    weights = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) / k**0.5 for k, n in shapes]
    for n in [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]:
        xs = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for k, _ in shapes]
        dys = [torch.randn(n, nn, device=dev, dtype=torch.bfloat16) for _, nn in shapes]
        flops = sum(2 * n * k * nn for k, nn in shapes)
        fwd = timed(lambda: [x @ w for x, w in zip(xs, weights)])
        bwd = timed(lambda: [(dy @ w.t(), x.t() @ dy) for x, w, dy in zip(xs, weights, dys)])
        row = {"tokens": n, "forward_s": fwd, "backward_s": bwd,
               "forward_flops_per_s": flops / fwd, "backward_flops_per_s": 2 * flops / bwd}
        out["gemm"].append(row)
        print("gemm", row, flush=True)
        del xs, dys
    heads, kv, d = 8, 1, 128
    for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]:
        for L in [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]:
            try:
                q = torch.randn(1, heads, L, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(1, heads, L, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(1, heads, L, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                flops = 4 * d * heads * L * (L + 1) / 2
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    g = torch.randn_like(o)
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters=5)
                    def fb():
                        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(y, (q, k, v), g)
                    both = timed(fb, iters=5)
                row = {"backend": str(backend).split(".")[-1], "tokens": L, "forward_s": fwd,
                       "backward_s": both - fwd, "forward_flops_per_s": flops / fwd,
                       "backward_flops_per_s": 2.5 * flops / (both - fwd)}
                out["attention"].append(row)
                print("attention", row, flush=True)
            except Exception as err:  # a backend this build or GPU lacks
                print("attention", backend, L, "failed:", repr(err)[:200], flush=True)
                break
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "kernels.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
