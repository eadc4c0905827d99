#!/usr/bin/env bash
# The main job on a shipped example: compile one training step of Llama-2 7B on 128 simulated
# H100s (tp=8, pp=4, dp=4) from 20,000 Wikipedia document lengths with the slimpack strategy,
# and print the simulated step.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --quiet
./target/release/slimpack compile --config examples/llama7b-wikipedia.toml --strategy slimpack \
    --emit ir -o target/llama7b-wikipedia.sir --timeline target/llama7b-wikipedia.svg "$@"
echo "IR written to target/llama7b-wikipedia.sir ($(wc -l < target/llama7b-wikipedia.sir) lines), timeline to target/llama7b-wikipedia.svg"
