#!/usr/bin/env bash
# Set up everything the suite needs, then run lint and the whole test suite. Arguments go to
# pytest (e.g. bash scripts/test.sh -x tests/test_views.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check .
echo "==> pytest"
# Two workers: most of the suite's wall time is real jobs waiting on real clocks (evidence
# windows, scrapes, alert durations), which overlap well on two cores. Whole files go to one
# worker (--dist loadfile; tests/conftest.py's scheduler makes the alone files one unit): a
# module's shared run (a fixture) starts once, not once per worker.
# Files go out in the order tests/conftest.py sets (--no-loadscope-reorder); it also keeps the
# tests that judge time from running beside another job. A later -n (e.g. -n 0) wins.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
  --no-loadscope-reorder "$@"
