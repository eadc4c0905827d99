#!/usr/bin/env python3
"""Markdown tables of docs/BENCHMARKS.md from the bench JSONs scripts/bench-scenarios.sh writes.

Usage: scripts/bench-report.py [target/bench] > tables.md
Every figure is a run total as `slimpack bench` reports it (useful FLOP/s = model FLOPs of the
tokens trained over the summed step time; efficiencies weighted by step time).
"""
import glob
import json
import os
import sys

LOSSES = [
    "useful_compute_s", "recompute_s", "below_saturation_s", "memory_bound_s",
    "launch_overhead_s", "exposed_tp_s", "exposed_cp_s", "exposed_pp_s",
    "pipeline_idle_warmup_s", "pipeline_idle_steady_s", "pipeline_idle_drain_s",
    "dp_imbalance_wait_s", "dp_sync_optimizer_s", "padding_s",
]
ABLATIONS = ["asymmetric", "dp-merge", "slicing", "eqsat", "zero-bubble", "stage-recompute",
             "pack-recompute", "interleave"]


def order(path):
    name = os.path.basename(path)[:-5]
    return (name[0] != "S", int(name[1:]) if name[1:].isdigit() else 0)


def load(directory):
    runs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json")), key=order):
        with open(path) as f:
            report = json.load(f)
        rows = {row["name"]: row for row in report["strategies"]}
        runs.append((os.path.basename(path)[:-5], report["config"], rows))
    return runs


def ratio(a, b):
    return a / b if a and b else float("nan")


def fits(row):
    # Within the memory limit on every step (and so within device memory).
    return not row.get("oom") and not row.get("over_limit")


def main():
    runs = load(sys.argv[1] if len(sys.argv) > 1 else "target/bench")
    out = []
    w = out.append
    w("| scenario | steps | slimpack useful PF/s | vs best peer | vs megatron | vs megatron-paper "
      "| megatron-paper ceiling | efficiency | schedule eff. | re-plans | peak GiB |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for sid, config, rows in runs:
        s = rows.get("slimpack")
        if not s:
            continue
        best = config.get("best_peer")
        paper = rows.get("megatron-paper")
        ceiling = ratio(paper["step_time_s"], paper["useful_ideal_step_time_s"]) if paper else float("nan")
        w(f"| {sid} | {s['steps']} | {s['useful_flops_per_s'] / 1e15:.1f} "
          f"| {ratio(s['useful_flops_per_s'], rows[best]['useful_flops_per_s']) if best else float('nan'):.2f}x ({best}) "
          f"| {ratio(s['useful_flops_per_s'], rows['megatron']['useful_flops_per_s']) if 'megatron' in rows else float('nan'):.2f}x "
          f"| {s['speedup_vs_megatron_paper'] or float('nan'):.2f}x | {ceiling:.2f}x "
          f"| {100 * s['efficiency']:.1f}% | {100 * s.get('schedule_efficiency', float('nan')):.1f}% "
          f"| {s['replans']} | {s['peak_memory_bytes'] / 2**30:.1f} |")
    w("")
    w("Every strategy (useful PF/s; `*`: over the memory limit on some step; n/a: not applicable):")
    w("")
    names = []
    for _, _, rows in runs:
        for name in rows:
            if name not in names and not name.startswith("slimpack-"):
                names.append(name)
    w("| scenario | " + " | ".join(names) + " |")
    w("|---|" + "---|" * len(names))
    for sid, config, rows in runs:
        cells = []
        for name in names:
            row = rows.get(name)
            if row is None:
                cells.append("n/a" if name in config.get("not_applicable", {}) else "")
            else:
                cells.append(f"{row['useful_flops_per_s'] / 1e15:.1f}{'' if fits(row) else '*'}")
        w(f"| {sid} | " + " | ".join(cells) + " |")
    w("")
    w("megatron as a competent user tunes it (bin size, block recompute) against `megatron-paper`, and their configurations:")
    w("")
    w("| scenario | megatron over megatron-paper | megatron config | megatron-paper config |")
    w("|---|---|---|---|")
    for sid, config, rows in runs:
        if "megatron" in rows and "megatron-paper" in rows:
            chosen = config.get("chosen", {})
            w(f"| {sid} | {ratio(rows['megatron']['useful_flops_per_s'], rows['megatron-paper']['useful_flops_per_s']):.2f}x "
              f"| `{chosen.get('megatron', '')}` | `{chosen.get('megatron-paper', '')}` |")
    w("")
    w("Where the step goes (seconds per step, device-averaged), slimpack and the best peer:")
    w("")
    w("| scenario | strategy | step s | " + " | ".join(l[:-2].replace("_", " ") for l in LOSSES) + " |")
    w("|---|---|---|" + "---|" * len(LOSSES))
    for sid, config, rows in runs:
        for name in ["slimpack", config.get("best_peer")]:
            row = rows.get(name)
            if not row or "losses" not in row:
                continue
            losses = row["losses"]
            w(f"| {sid} | {name} | {row['step_time_s']:.2f} | "
              + " | ".join(f"{losses.get(l, 0):.2f}" for l in LOSSES) + " |")
    w("")
    w("The gap to the best peer by cause: seconds of slimpack's step each loss costs beyond the "
      "peer's rate for the same useful work ((slimpack loss / slimpack useful - peer loss / peer "
      "useful) x slimpack useful); positive: slimpack loses there, negative: it wins there; they "
      "add up to the gap:")
    w("")
    causes = [l for l in LOSSES if l != "useful_compute_s"]
    w("| scenario | best peer | gap s (% of step) | " + " | ".join(l[:-2].replace("_", " ") for l in causes) + " |")
    w("|---|---|---|" + "---|" * len(causes))
    for sid, config, rows in runs:
        s, best = rows.get("slimpack"), config.get("best_peer")
        peer = rows.get(best) if best else None
        if not s or not peer or "losses" not in s or "losses" not in peer:
            continue
        us, up = s["losses"]["useful_compute_s"], peer["losses"]["useful_compute_s"]
        excess = [(s["losses"].get(l, 0) / us - peer["losses"].get(l, 0) / up) * us for l in causes]
        gap = sum(excess)
        w(f"| {sid} | {best} | {gap:+.2f} ({100 * gap / s['step_time_s']:+.1f}%) | "
          + " | ".join(f"{e:+.2f}" for e in excess) + " |")
    w("")
    w("Ablations: slimpack's useful FLOP/s over the variant with one idea off (above 1.00x: the idea helps):")
    w("")
    w("| scenario | " + " | ".join(ABLATIONS) + " |")
    w("|---|" + "---|" * len(ABLATIONS))
    for sid, _, rows in runs:
        s = rows.get("slimpack")
        if not s:
            continue
        cells = []
        for idea in ABLATIONS:
            off = rows.get(f"slimpack-no-{idea}")
            cells.append(f"{ratio(s['useful_flops_per_s'], off['useful_flops_per_s']):.2f}x" if off else "")
        w(f"| {sid} | " + " | ".join(cells) + " |")
    optin = [(sid, config, rows) for sid, config, rows in runs if "slimpack-outlier-delay" in rows]
    if optin:
        w("")
        w("Opt-in `slimpack-outlier-delay` (WLB-LLM's outlier delay, then slimpack's search; it "
          "changes which step trains a document, so it is never the default) against the best peer:")
        w("")
        w("| scenario | useful PF/s | vs best peer | vs slimpack | re-plans |")
        w("|---|---|---|---|---|")
        for sid, config, rows in optin:
            d, s, best = rows["slimpack-outlier-delay"], rows.get("slimpack"), config.get("best_peer")
            w(f"| {sid} | {d['useful_flops_per_s'] / 1e15:.1f}{'' if fits(d) else '*'} "
              f"| {ratio(d['useful_flops_per_s'], rows[best]['useful_flops_per_s']) if best else float('nan'):.2f}x ({best}) "
              f"| {ratio(d['useful_flops_per_s'], s['useful_flops_per_s']) if s else float('nan'):.2f}x | {d['replans']} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
