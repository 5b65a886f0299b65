#!/usr/bin/env bash
# Create .venv and install fsdpmon into it (idempotent; re-runs only when pyproject.toml changes).
# Usage: bash scripts/setup.sh [--test]   (--test also installs test extras and Debian packages)
#
# torch: the CPU build of 2.13.0. From https://download.pytorch.org/whl/cpu when that index
# answers (a stock pip's default index would give the CUDA build and several GB of nvidia-*
# wheels); otherwise whatever this machine's pip resolves (a pip set up with local CPU wheels
# keeps working). TORCH_INDEX_URL=URL picks another index (e.g. .../whl/cu128 on a GPU machine);
# TORCH_INDEX_URL=default takes what pip resolves without trying the CPU index. The script says
# which build it installed. FSDPMON_NO_APT=1 skips the Debian packages (offline GPU machines).
# A torch already importable in .venv is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1
TORCH_VERSION=2.13.0
# torchtitan's source, for tests/test_torchtitan_adapter.py: --no-deps, because its dependencies
# (datasets, wandb, tensorboard, ...) are too heavy for the test extras and the test only reads
# and compiles its source (torchtitan needs CUDA and triton to run: docs/integrations/torchtitan.md).
# A failed install stops the setup, except with FSDPMON_NO_APT=1 (offline GPU machines).
TORCHTITAN_VERSION=0.3.0
CPU_INDEX=https://download.pytorch.org/whl/cpu

apt_install() {
  echo "==> installing Debian packages: $*" >&2
  command -v apt-get >/dev/null || { echo "setup.sh: install $* (no apt-get here)" >&2; exit 1; }
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
# A bare Debian's python3 has no venv/ensurepip until python3-venv is installed.
[ -x .venv/bin/python ] || python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ "$want_test" = 1 ] && [ "${FSDPMON_NO_APT:-0}" != 1 ]; then
  command -v promtool >/dev/null || need+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
  command -v tmux >/dev/null || need+=(tmux)
  command -v vmalert >/dev/null || need+=(victoria-metrics)  # the shipped rules load in vmalert
fi
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"

# FSDPMON_VENV_SYSTEM_SITE=1: the venv also sees the system's packages (a GPU image's torch).
venv_flags=(); [ "${FSDPMON_VENV_SYSTEM_SITE:-0}" = 1 ] && venv_flags=(--system-site-packages)
[ -x .venv/bin/python ] || { echo "==> creating .venv ${venv_flags[*]}" >&2
  python3 -m venv "${venv_flags[@]}" .venv; }
extras="train,hf,report"; [ "$want_test" = 1 ] && extras="test"   # test includes train
installed="$extras"; [ "$want_test" = 1 ] && installed="test-torchtitan$TORCHTITAN_VERSION"
stamp=".venv/.fsdpmon-$(sha1sum <pyproject.toml | cut -c1-12)-$installed"
[ -f "$stamp" ] && exit 0

log=.venv/pip-install.log
pip() { .venv/bin/pip install --disable-pip-version-check "$@" >>"$log" 2>&1 || {
  echo "pip install $* failed; last lines of $log:" >&2; tail -n 30 "$log" >&2; exit 1; }; }

reachable() {  # whether a pip index answers within 5 s (no network: fails at once)
  .venv/bin/python - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
PY
}

install_torch() {
  local index="${TORCH_INDEX_URL:-}"
  if [ -z "$index" ] && reachable "$CPU_INDEX"; then index="$CPU_INDEX"; fi
  if [ "$index" = default ]; then
    echo "==> torch $TORCH_VERSION as this machine's pip resolves it (TORCH_INDEX_URL=default)" >&2
    pip "torch==$TORCH_VERSION"
  elif [ -n "$index" ]; then
    echo "==> torch $TORCH_VERSION from $index" >&2
    pip --index-url "$index" "torch==$TORCH_VERSION"
  else
    echo "==> torch $TORCH_VERSION as this machine's pip resolves it ($CPU_INDEX unreachable)" >&2
    pip "torch==$TORCH_VERSION"
  fi
  .venv/bin/python -W ignore -c 'import torch; cuda = torch.version.cuda
print(f"==> installed torch {torch.__version__}: "
      + (f"CUDA {cuda} build" if cuda else "CPU build"))' >&2
}

echo "==> installing Python packages into .venv (torch first: about a minute)" >&2
pip --upgrade pip
.venv/bin/python -c 'import torch' 2>/dev/null || install_torch
pip -e ".[$extras]"
if [ "$want_test" = 1 ]; then
  if [ "${FSDPMON_NO_APT:-0}" = 1 ]; then  # an offline GPU machine: its tests skip, saying why
    .venv/bin/pip install --disable-pip-version-check --no-deps "torchtitan==$TORCHTITAN_VERSION" \
      >>"$log" 2>&1 || echo "==> torchtitan $TORCHTITAN_VERSION not installed (see $log)" >&2
  else
    pip --no-deps "torchtitan==$TORCHTITAN_VERSION"
  fi
fi
touch "$stamp"
