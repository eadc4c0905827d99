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
cargo test --workspace --all-features --quiet
scripts/test-python.sh
