#!/usr/bin/env bash
# Installs what the Python package (python/) and its tests need, on a fresh Debian 12 machine or
# here: python3 with venv, a virtual environment (SLIMPACK_PYTHON_VENV, default
# target/python-venv, reused when present) holding maturin, numpy, pytest, torch (CPU wheels
# from the PyTorch index when it is reachable, else PyPI's) and megatron-core; then builds the
# package (`pip install ./python`, the README's command) into it. Downloads happen only when
# something is missing; the rebuild of the package works offline.
# Sourced by scripts/test-python.sh; exports SLIMPACK_PYTHON.
set -euo pipefail

if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then as_root=(); else as_root=(sudo); fi
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python3-pip >/dev/null
fi

SLIMPACK_PYTHON_VENV="${SLIMPACK_PYTHON_VENV:-$PWD/target/python-venv}"
if [ ! -x "$SLIMPACK_PYTHON_VENV/bin/python" ]; then
    mkdir -p "$(dirname "$SLIMPACK_PYTHON_VENV")"
    python3 -m venv "$SLIMPACK_PYTHON_VENV"
fi
export SLIMPACK_PYTHON="$SLIMPACK_PYTHON_VENV/bin/python"
export PATH="$SLIMPACK_PYTHON_VENV/bin:$PATH"  # maturin, for the build without isolation
# No download cache: the environment itself is the cache, and torch's wheels (~3 GB with their
# CUDA libraries) would otherwise sit on the disk twice.
pip_quiet() {
    "$SLIMPACK_PYTHON" -m pip install -q --disable-pip-version-check --no-cache-dir "$@"
}

if ! "$SLIMPACK_PYTHON" -c 'import maturin, numpy, pytest' >/dev/null 2>&1; then
    pip_quiet 'maturin>=1.5,<2' numpy pytest
fi
if ! "$SLIMPACK_PYTHON" -c 'import torch' >/dev/null 2>&1; then
    pip_quiet torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null || pip_quiet torch
fi
if ! "$SLIMPACK_PYTHON" -c 'import megatron.core.packed_seq_params' >/dev/null 2>&1; then
    pip_quiet megatron-core
fi

# The extension shares the workspace's target directory (its release build of the crates).
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" pip_quiet --no-build-isolation ./python
