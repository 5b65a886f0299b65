#!/usr/bin/env bash
# Create .venv and install fsdpmon into it (idempotent; re-runs only when pyproject.toml changes).
# Usage: bash scripts/setup.sh [--test]   (--test also installs test extras and Debian packages)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ "$want_test" = 1 ]; then
  need=()
  command -v promtool >/dev/null || need+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
  command -v tmux >/dev/null || need+=(tmux)
  if [ ${#need[@]} -gt 0 ]; then
    echo "==> installing Debian packages: ${need[*]}" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

[ -x .venv/bin/python ] || { echo "==> creating .venv" >&2; python3 -m venv .venv; }
extras="hf,report"; [ "$want_test" = 1 ] && extras="test"
stamp=".venv/.fsdpmon-$(sha1sum pyproject.toml | cut -c1-12)-$extras"
if [ ! -f "$stamp" ]; then
  echo "==> installing Python packages into .venv (torch CPU build first: about a minute)" >&2
  log=.venv/pip-install.log
  pip() { .venv/bin/pip install --disable-pip-version-check "$@" >>"$log" 2>&1 || {
    echo "pip install $* failed; last lines of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }; }
  pip --upgrade pip
  # Pin the CPU build explicitly: an unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/python -c 'import torch' 2>/dev/null || pip torch==2.13.0
  pip -e ".[$extras]"
  touch "$stamp"
fi
