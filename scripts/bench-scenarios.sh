#!/usr/bin/env bash
# The benchmark scenarios of docs/BENCHMARKS.md — S1-S7 on the shared data, H1-H7 on held-out
# corpora built from text on this machine (scripts/heldout-corpora.py, tokenized by slimpack's
# own cl100k tokenizer; built on first use): every strategy (and slimpack's ablations)
# over seeded global batches, simulated on H100 SXM, all by the same rules: tuned on the first 3
# steps, a 92% memory limit (a step over it is re-planned and counted), and drained (wlb trains
# what it delayed in extra steps, so every strategy trains the same tokens).
#
#   scripts/bench-scenarios.sh               # every scenario, 20 steps each
#   scripts/bench-scenarios.sh S6 S7         # only these
#   STEPS=5 scripts/bench-scenarios.sh S4    # fewer steps (to time a scenario)
#
# Needs ../shared/data (the shared length files). Writes target/bench/<id>.json and prints each
# table with the scenario's wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-20}
STRATEGIES=padding,megatron-paper,megatron,bfd,ff,kk,wlb,hybrid-cp,slimpack,slimpack-no-asymmetric,slimpack-no-dp-merge,slimpack-no-slicing,slimpack-no-eqsat,slimpack-no-zero-bubble,slimpack-no-stage-recompute,slimpack-no-pack-recompute,slimpack-no-interleave,slimpack-outlier-delay
# The held-out scenarios run the strategies without slimpack's ablations but the newest
# (per-pack recomputation), with the opt-in outlier-delay row.
HELDOUT_STRATEGIES=padding,megatron-paper,megatron,bfd,ff,kk,wlb,hybrid-cp,slimpack,slimpack-no-pack-recompute,slimpack-outlier-delay
source scripts/scenarios.sh

ids=("$@")
if [ ${#ids[@]} -eq 0 ]; then
    ids=("${ORDER[@]}")
fi
for id in "${ids[@]}"; do
    if [ -z "${SCENARIOS[$id]+set}" ]; then
        echo "error: unknown scenario '$id' (valid: ${ORDER[*]})" >&2
        exit 2
    fi
done

source scripts/setup.sh
cargo build --release --quiet
S=${CARGO_TARGET_DIR:-target}/release/slimpack
mkdir -p target/bench
# The held-out corpora the chosen scenarios read (built if this machine has not yet).
corpora=()
for id in "${ids[@]}"; do
    if [[ "${SCENARIOS[$id]}" =~ $HELDOUT/([a-z-]+)\.lengths\.txt ]]; then
        corpora+=("${BASH_REMATCH[1]}")
    fi
done
build_missing_heldout "$S" "${corpora[@]}"
for id in "${ids[@]}"; do
    echo "=== $id: ${SCENARIOS[$id]}"
    start=$SECONDS
    # shellcheck disable=SC2086 # the scenario's flags split on spaces
    strategies=$STRATEGIES
    case "$id" in H*) strategies=$HELDOUT_STRATEGIES ;; esac
    "$S" bench ${SCENARIOS[$id]} --cluster h100-sxm --steps "$STEPS" --tune-steps 3 \
        --memory-limit 0.92 --drain --strategies "$strategies" --json "target/bench/$id.json"
    echo "($id: $STEPS steps in $((SECONDS - start)) s)"
done
