#!/usr/bin/env bash
# Installs what building slimpack needs on a fresh Debian 12 machine: a C toolchain, Rust, and
# LLVM/MLIR 22 (for the mlir and llvm features).
# Idempotent: does nothing that is already there. Sourced by run-example.sh and test.sh.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v cc >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        build-essential curl ca-certificates pkg-config git >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi

# LLVM/MLIR 22 for the `mlir` and `llvm` features (CI builds with --all-features): Debian 12's
# packages, found through .cargo/config.toml's prefixes. The default build needs none of it.
if [ ! -x /usr/lib/llvm-22/bin/mlir-opt ] || [ ! -x /usr/lib/llvm-22/bin/llc ] \
    || [ ! -f /usr/lib/llvm-22/lib/libMLIRCAPIIR.a ]; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        llvm-22-dev libmlir-22-dev mlir-22-tools libpolly-22-dev libclang1-22 \
        libclang-common-22-dev libzstd-dev zlib1g-dev g++ >/dev/null
fi
