#!/usr/bin/env bash
# Set up everything the suite needs, then run lint and the whole test suite. Arguments go to
# pytest (e.g. bash scripts/test.sh -x tests/test_views.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check .
echo "==> pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
