#!/usr/bin/env bash
# The tests marked `slow` (heavy compiles that the default suite and CI leave out: see the
# `slow` marker in pyproject.toml), run in one process so their compiles do not compete for the
# cores, with the ten slowest listed at the end. Run from anywhere, with the environment's python
# (the venv the package is installed in):
#
#   benchmarks/slow_tests.sh                      # all of them
#   benchmarks/slow_tests.sh tests/test_pipeline.py   # a batch: any pytest arguments narrow it
#
# On a loaded 2-core machine they take tens of minutes; docs/speed.md has the last measured time.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
# -m slow replaces pyproject's `-m 'not slow'`; -n 0 turns pytest-xdist's workers off.
exec "$PYTHON" -m pytest -m slow -n 0 -q --durations=10 "$@"
