#!/usr/bin/env bash
# The whole test suite: formatting, the default build, and every cargo feature.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
rustup component add rustfmt >/dev/null 2>&1 || true
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all -- --check
fi
cargo test --workspace --quiet
# Every feature, cuda included: it builds without a CUDA toolkit (cudarc loads the libraries at
# run time); with no GPU its tests check the one-line refusals and say the GPU runs were skipped.
cargo test --workspace --all-features --quiet
scripts/test-python.sh
