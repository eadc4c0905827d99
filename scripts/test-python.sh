#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest): sets up the environment (setup-python.sh)
# and runs them. Called by scripts/test.sh after the cargo suites.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-python.sh
cd python
"$SLIMPACK_PYTHON" -m pytest -q -p no:cacheprovider tests
