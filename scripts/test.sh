#!/usr/bin/env bash
# The whole test suite: formatting, the default build, and every cargo feature.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
if [ "${CI:-}" = "true" ]; then
    # A fresh machine builds once: incremental caches only cost disk (GBs with LLVM linked in).
    export CARGO_INCREMENTAL=0
fi
rustup component add rustfmt >/dev/null 2>&1 || true
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all -- --check
fi
cargo test --workspace --quiet
# Every feature, cuda included: it builds without a CUDA toolkit (cudarc loads the libraries at
# run time); with no GPU its tests check the one-line refusals and say the GPU runs were skipped.
cargo test --workspace --all-features --quiet
if [ "${CI:-}" = "true" ]; then
    # The Python suite builds its own release extension and installs torch (~5 GB): on a fresh
    # machine, hand back the debug builds' disk first (the CI machine's disk has run out here).
    rm -rf "${CARGO_TARGET_DIR:-target}/debug"
fi
scripts/test-python.sh
