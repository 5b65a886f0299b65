#!/usr/bin/env bash
# Set up everything the suite needs, then run lint, the whole test suite, and the parse, filing
# and `top` tests a second time on the Python twins of the C halves (FSDPMON_PURE_PYTHON=1, as on
# a machine without a C compiler: fsdpmon/scrape/fastpath.py). Arguments go to the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check .
echo "==> pytest"
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
# The tests that read, file and show expositions without choosing a half themselves (those
# that compare the halves run both in the first run already).
pure_python_tests=(
  tests/test_fastpath.py tests/test_expfmt.py tests/test_expfmt_refs.py tests/test_fused.py
  tests/test_snapshot.py tests/test_aggregate.py tests/test_targets_source.py
  tests/test_targets_asking.py tests/test_kube_source.py tests/test_untrusted_input.py
  tests/test_views.py tests/test_app.py tests/test_top_cli.py
)
echo "==> pytest, pure Python (FSDPMON_PURE_PYTHON=1)"
FSDPMON_PURE_PYTHON=1 exec .venv/bin/python -m pytest -q -p no:cacheprovider \
  "${pure_python_tests[@]}"
