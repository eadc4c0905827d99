#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): sets up the environment (setup-python.sh)
# and runs them against the installed package. Called by scripts/test.sh after the cargo suites.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-python.sh
# From the repository root: run from python/, `python -m pytest` would import the source tree
# (without its built extension) instead of the installed package.
"$SLIMPACK_PYTHON" -m pytest -q -p no:cacheprovider python/tests
