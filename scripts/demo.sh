#!/usr/bin/env bash
# Set up, then run the local demo: a 2-rank tiny-model FSDP training watched by fsdpmon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fsdpmon demo "$@"
