#!/usr/bin/env bash
# The held-out sweep of docs/BENCHMARKS.md ("Held-out sweep"): slimpack against the peers on 72
# layouts that no scenario uses, over eleven corpora (the shared four and held-out ones built
# from text on this machine by scripts/heldout-corpora.py, several never used before the
# sweep), on the H100 unless a run names another cluster, 3 steps each, by the scoreboard's rules (tuned on 2 steps, a 92% memory limit, drained:
# wlb trains what it delayed in extra steps). Short by design: it looks for layouts where
# slimpack loses, and prints every run's ratio to the best peer.
#
#   scripts/heldout-sweep.sh             # all 72 runs (about 20-30 minutes on 2 cores)
#   scripts/heldout-sweep.sh R16 R27     # only these
#   SWEEP_RUNS=FILE scripts/heldout-sweep.sh   # the runs of FILE instead, one per line in the
#                                              # format below (scripts/loss-hunt.py writes them)
#   SWEEP_EXTRA=slimpack-no-interleave scripts/heldout-sweep.sh   # also run these strategies
#                                              # (in the JSON files; the table is slimpack's)
#
# Needs ../shared/data. Writes target/sweep/<run>.json and prints a markdown table of the runs.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/scenarios.sh
# run: corpus model parallel context global-batch-tokens [cluster, default h100-sxm]
RUNS=(
    "R01 python-packages llama-7b  tp=4,pp=1,dp=32 32768  8388608"
    "R02 python-packages llama-34b tp=8,pp=2,dp=8  131072 8388608"
    "R03 python-packages llama-70b tp=8,pp=4,dp=4  262144 8388608"
    "R04 tablegen        llama-13b tp=4,pp=4,dp=8  65536  8388608"
    "R05 tablegen        llama-70b tp=8,pp=8,dp=2  131072 8388608"
    "R06 tablegen        llama-7b  tp=8,pp=2,dp=32 262144 8388608"
    "R07 rust-docs       llama-7b  tp=4,pp=2,dp=8  32768  4194304"
    "R08 rust-docs       llama-13b tp=8,pp=1,dp=16 65536  4194304"
    "R09 rust-docs       llama-34b tp=8,pp=4,dp=4  131072 4194304"
    "R10 cxx-headers     llama-34b tp=4,pp=4,dp=16 65536  16777216"
    "R11 java-modules    llama-13b tp=8,pp=2,dp=16 262144 16777216"
    "R12 rust-files      llama-70b tp=8,pp=8,dp=8  131072 16777216"
    "R13 wikipedia       llama-13b tp=4,pp=8,dp=4  32768  8388608"
    "R14 prolong_like    llama-34b tp=8,pp=2,dp=16 65536  16777216"
    "R15 wlbllm_like     llama-7b  tp=4,pp=4,dp=8  131072 16777216"
    "R16 rust-docs       llama-13b tp=4,pp=2,dp=32 131072 8388608"
    "R17 rust-docs       llama-70b tp=8,pp=8,dp=4  65536  4194304"
    "R18 tablegen        llama-7b  tp=4,pp=1,dp=64 65536  8388608"
    "R19 python-packages llama-34b tp=8,pp=8,dp=2  32768  8388608"
    "R20 python-packages llama-13b tp=8,pp=4,dp=8  262144 8388608"
    "R21 rust-files      llama-7b  tp=8,pp=1,dp=32 65536  16777216"
    "R22 cxx-headers     llama-70b tp=8,pp=4,dp=16 131072 16777216"
    "R23 java-modules    llama-34b tp=4,pp=8,dp=4  262144 16777216"
    "R24 wlbllm_like     llama-13b tp=8,pp=1,dp=32 32768  16777216"
    "R25 prolong_like    llama-7b  tp=8,pp=4,dp=8  262144 16777216"
    "R26 rust-docs       llama-7b  tp=8,pp=2,dp=16 262144 4194304"
    "R27 rust-docs       llama-34b tp=8,pp=2,dp=16 131072 8388608"
    "R28 tablegen        llama-34b tp=8,pp=4,dp=16 131072 8388608"
    "R29 python-packages llama-13b tp=4,pp=2,dp=16 65536  8388608"
    "R30 wikipedia       llama-7b  tp=4,pp=2,dp=32 131072 8388608"
    "R31 rust-docs       llama-70b tp=8,pp=4,dp=2  262144 4194304"
    "R32 rust-docs       llama-7b  tp=4,pp=8,dp=2  65536  4194304"
    "R33 tablegen        llama-13b tp=8,pp=8,dp=1  65536  8388608"
    "R34 tablegen        llama-70b tp=4,pp=8,dp=4  262144 8388608"
    "R35 python-packages llama-7b  tp=8,pp=8,dp=8  131072 8388608"
    "R36 python-packages llama-34b tp=4,pp=4,dp=8  65536  4194304"
    "R37 cxx-headers     llama-7b  tp=4,pp=8,dp=16 32768  8388608"
    "R38 java-modules    llama-70b tp=8,pp=2,dp=16 131072 16777216"
    "R39 rust-files      llama-13b tp=4,pp=4,dp=32 262144 16777216"
    "R40 wikipedia       llama-70b tp=8,pp=2,dp=8  32768  8388608"
    "R41 prolong_like    llama-13b tp=4,pp=1,dp=16 32768  4194304"
    "R42 wlbllm_like     llama-34b tp=4,pp=8,dp=8  65536  16777216"
    # Added in stop 32, after the replica-order change, to look for losses where DP-Merge and
    # long contexts meet (pp 1-4 at 128K-256K); every run new.
    "R43 rust-docs       llama-13b tp=8,pp=2,dp=16 262144 4194304"
    "R44 rust-docs       llama-7b  tp=8,pp=4,dp=8  262144 8388608"
    "R45 prolong_like    llama-13b tp=8,pp=2,dp=16 262144 16777216"
    "R46 python-packages llama-7b  tp=8,pp=2,dp=16 262144 8388608"
    "R47 java-modules    llama-7b  tp=8,pp=2,dp=8  131072 8388608"
    "R48 tablegen        llama-13b tp=8,pp=2,dp=16 131072 8388608"
    "R49 wikipedia       llama-7b  tp=8,pp=2,dp=16 262144 8388608"
    "R50 rust-files      llama-13b tp=8,pp=2,dp=16 131072 8388608"
    "R51 cxx-headers     llama-7b  tp=8,pp=4,dp=16 262144 16777216"
    "R52 prolong_like    llama-34b tp=8,pp=4,dp=8  262144 16777216"
    "R53 rust-docs       llama-7b  tp=4,pp=2,dp=32 262144 8388608"
    "R54 wlbllm_like     llama-13b tp=8,pp=2,dp=16 262144 8388608"
    "R55 prolong_like    llama-7b  tp=8,pp=1,dp=32 131072 16777216"
    "R56 rust-docs       llama-13b tp=8,pp=1,dp=32 131072 8388608"
    # Added in stop 33 from a seeded random hunt for losses (60 layouts, every model, cluster
    # and context from 8K to 256K; docs/BENCHMARKS.md, "Loss hunt"): its two losses (R57,
    # R58) and layouts unlike R01-R56 (other clusters, 4K-16K contexts, dp up to 128).
    "R57 python-packages llama-34b tp=8,pp=4,dp=16 131072 2097152 h800"
    "R58 wikipedia       llama-34b tp=8,pp=1,dp=8  65536  8388608"
    "R59 rust-files      llama-70b tp=2,pp=8,dp=2  131072 16777216"
    "R60 python-files    llama-13b tp=4,pp=2,dp=16 16384  8388608 a100-80g"
    "R61 wlbllm_like     llama-70b tp=8,pp=8,dp=4  262144 16777216 h200"
    "R62 prolong_like    llama-13b tp=8,pp=2,dp=8  131072 16777216 h800"
    "R63 man-pages       llama-13b tp=8,pp=1,dp=8  4096   2097152"
    "R64 debian-docs     llama-7b  tp=1,pp=1,dp=128 8192  8388608"
    "R65 perl-modules    llama-7b  tp=4,pp=2,dp=8  65536  1048576"
    "R66 perl-modules    llama-13b tp=8,pp=2,dp=4  262144 1048576"
    "R67 cxx-headers     llama-7b  tp=2,pp=8,dp=32 262144 8388608"
    "R68 python-files    llama-70b tp=8,pp=4,dp=64 131072 16777216"
    "R69 wlbllm_like     llama-70b tp=8,pp=4,dp=64 65536  4194304 h800"
    "R70 man-pages       llama-7b  tp=8,pp=8,dp=4  8192   8388608 h800"
    "R71 cpython_stdlib  llama-70b tp=8,pp=4,dp=8  65536  1048576 h200"
    "R72 cxx-headers     llama-13b tp=8,pp=8,dp=64 16384  4194304 a100-80g"
)
STRATEGIES=megatron,megatron-paper,bfd,kk,wlb,slimpack${SWEEP_EXTRA:+,$SWEEP_EXTRA}
if [ -n "${SWEEP_RUNS:-}" ]; then
    mapfile -t RUNS < <(grep -v '^\s*\(#\|$\)' "$SWEEP_RUNS")
fi

wanted=("$@")
selected=()
for run in "${RUNS[@]}"; do
    read -r id _ <<<"$run"
    if [ ${#wanted[@]} -eq 0 ] || [[ " ${wanted[*]} " == *" $id "* ]]; then
        selected+=("$run")
    fi
done
for id in "${wanted[@]}"; do
    if ! printf '%s\n' "${RUNS[@]}" | grep -q "^$id "; then
        echo "error: unknown run '$id' (valid: ${RUNS[0]%% *}-${RUNS[-1]%% *})" >&2
        exit 2
    fi
done

source scripts/setup.sh
cargo build --release --quiet
S=${CARGO_TARGET_DIR:-target}/release/slimpack
mkdir -p target/sweep

dataset() {
    case "$1" in
        wikipedia | prolong_like | wlbllm_like | cpython_stdlib) echo "$DATA/$1.lengths.txt" ;;
        *) echo "$HELDOUT/$1.lengths.txt" ;;
    esac
}
corpora=()
for run in "${selected[@]}"; do
    read -r _ corpus _ <<<"$run"
    if [[ "$(dataset "$corpus")" == $HELDOUT/* ]]; then
        corpora+=("$corpus")
    fi
done
build_missing_heldout "$S" "${corpora[@]}"

jsons=()
failed=0
for run in "${selected[@]}"; do
    read -r id corpus model parallel context tokens cluster <<<"$run"
    cluster=${cluster:-h100-sxm}
    file=$(dataset "$corpus")
    if [ ! -f "$file" ]; then
        echo "$id: $corpus is not on this machine, skipped" >&2
        continue
    fi
    start=$SECONDS
    if ! "$S" bench --model "$model" --cluster "$cluster" --parallel "$parallel" --context "$context" \
        --global-batch-tokens "$tokens" --dataset "$file" --steps 3 --tune-steps 2 \
        --memory-limit 0.92 --drain --strategies "$STRATEGIES" \
        --json "target/sweep/$id.json" >/dev/null; then
        echo "$id: bench failed (above); left out of the table" >&2
        failed=$((failed + 1))
        continue
    fi
    echo "$id: $corpus $model $parallel ${context} ${tokens} $cluster ($((SECONDS - start)) s)" >&2
    jsons+=("$id|$corpus $model $parallel $context $tokens $cluster|target/sweep/$id.json")
done

python3 - "${jsons[@]}" <<'PY'
import json, sys

print("| run | corpus | model | layout | context | batch tokens | slimpack PF/s | best peer | vs best peer | vs megatron |")
print("|---|---|---|---|---|---|---|---|---|---|")
losses = 0
for arg in sys.argv[1:]:
    run, what, path = arg.split("|")
    corpus, model, parallel, context, tokens, cluster = what.split()
    layout = parallel if cluster == "h100-sxm" else f"{parallel} on {cluster}"
    report = json.load(open(path))
    figures = {s["name"]: s for s in report["strategies"]}
    # The best peer as bench picks it: the fastest that fits the memory limit on every step.
    best = report["config"]["best_peer"]
    ours = figures["slimpack"]
    ratio = ours["speedup_vs_best_peer"] if best else None
    # Without a fitting peer, a fitting slimpack is no loss.
    over = ours["oom"] or ours.get("over_limit", False)
    lost = over or (ratio is not None and ratio < 1.0)
    losses += lost
    useful = lambda s: s["useful_flops_per_s"] / 1e15
    mark = "**" if lost else ""
    peer = f"{best} {useful(figures[best]):.2f}" if best else "none fits"
    shown = f"{ratio:.3f}x" if ratio is not None else "-"
    print(f"| {run} | {corpus} | {model} | {layout} | {int(context) // 1024}K | "
          f"{int(tokens) / 2**20:g}M | {useful(ours):.2f}{' (over the limit)' if over else ''} | "
          f"{peer} | {mark}{shown}{mark} | {useful(ours) / useful(figures['megatron']):.3f}x |")
print(f"\n{losses} of {len(sys.argv) - 1} runs below 1.00x the best peer (or over the memory limit)")
PY
if [ "$failed" -gt 0 ]; then
    echo "$failed run(s) failed" >&2
    exit 1
fi
