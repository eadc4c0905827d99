#!/usr/bin/env bash
# The benchmark scenarios S1-S5 of docs/BENCHMARKS.md: every strategy (and slimpack's ablations)
# over 20 seeded global batches, simulated on H100 SXM. Needs ../shared/data (the shared length
# files). Writes target/bench/<id>.json and prints each table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --quiet
mkdir -p target/bench
S=./target/release/slimpack
STRATEGIES=padding,megatron,bfd,ff,kk,wlb,hybrid-cp,slimpack,slimpack-no-asymmetric,slimpack-no-dp-merge,slimpack-no-slicing,slimpack-no-eqsat
scenario() {
    local id=$1; shift
    echo "=== $id: $*"
    "$S" bench "$@" --cluster h100-sxm --steps 20 --strategies "$STRATEGIES" --json "target/bench/$id.json"
}
scenario S1 --model llama-7b --parallel tp=4,pp=2,dp=16 --context 65536 --global-batch-tokens 8388608 --dataset ../shared/data/wikipedia.lengths.txt
scenario S2 --model llama-13b --parallel tp=8,pp=2,dp=8 --context 131072 --global-batch-tokens 16777216 --dataset ../shared/data/prolong_like.lengths.txt
scenario S3 --model llama-34b --parallel tp=8,pp=4,dp=8 --context 262144 --global-batch-tokens 16777216 --dataset ../shared/data/wlbllm_like.lengths.txt
scenario S4 --model llama-70b --parallel tp=8,pp=8,dp=4 --context 262144 --global-batch-tokens 16777216 --dataset ../shared/data/wikipedia.lengths.txt
scenario S5 --model llama-150b --parallel tp=8,pp=16,dp=2 --context 262144 --global-batch-tokens 16777216 --dataset ../shared/data/wikipedia.lengths.txt
