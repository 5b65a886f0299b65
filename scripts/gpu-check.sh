#!/usr/bin/env bash
# The CUDA paths, checked on a real GPU in one command, within 8 minutes in all
# (GPU_CHECK_BUDGET seconds, default 480: each step is capped by its own limit and what is left):
#   1. setup     scripts/setup.sh --test (no Debian packages); torch must see CUDA
#   2. gpu tests the GPU-marked tests (pytest -m gpu), apart from the one below
#   3. sync      the monitor's sync-debug test: 50 steps under set_sync_debug_mode("error")
#   4. exporter  `fsdpmon exporter` on real NVML, scraped 3 times: one gpu series set per GPU
#                that nvidia-smi lists, and promtool's check where promtool is installed
#   5. offload   the trainer's --cpu-offload path on the GPU (tiny model, 10 steps)
#   6. train     a llama2-7b-shaped model with its layers reduced, on one GPU (bf16, seq 4096)
#                via benchmarks/bench_trainer.py: tokens/s and MFU
# Writes DIR/summary.txt (one line per step: PASS/FAIL/SKIP and its figures) and each step's log.
# On a machine without a GPU it writes a summary that says it skipped, and exits 0.
#
# Usage: bash scripts/gpu-check.sh [DIR]    (default DIR: gpu-check/, or $OUT when that is set)
# Offline: an existing .venv is used as it is; without one, a system torch with CUDA is reused
# (venv --system-site-packages) and pip must find the rest locally.
# Env: GPU_LAYERS (default 8), TORCH_INDEX_URL (see setup.sh; default here: what pip resolves,
# which is the CUDA build on a stock pip).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
failed=0
start_all=$SECONDS
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-480}))

note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME TIMEOUT_S COMMAND...: run it, log to DIR/NAME.log, record PASS/FAIL
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS left=$((deadline - SECONDS))
  if [ $left -lt 15 ]; then
    note "FAIL $name: not run, the ${GPU_CHECK_BUDGET:-480}s budget is spent"; failed=1; return 1
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "==> $name (at most ${limit}s)" >&2
  timeout --kill-after=5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  # What the step measured: its RESULT lines, else pytest's closing line ("3 passed in 9.1s").
  local what
  what=$(grep -h '^RESULT ' "$out/$name.log" | cut -c8- | tr '\n' ' ')
  [ -n "$what" ] || what=$(grep -E '(passed|failed|skipped|error).* in [0-9.]+s' \
    "$out/$name.log" | tail -n 1 | tr -d '=')
  # On a GPU machine a skipped GPU test is a failure: it means CUDA was not usable.
  if [ $rc = 0 ] && grep -qE '[0-9]+ skipped' <<<"$what"; then rc=3; fi
  if [ $rc = 0 ]; then
    note "PASS $name (${took}s) $what"
  else
    case $rc in 124) why="timed out after ${limit}s" ;; 3) why="skipped: $what" ;;
      *) why="exit $rc" ;; esac
    note "FAIL $name (${took}s, $why): see $out/$name.log"
    tail -n 15 "$out/$name.log" | sed 's/^/    /' >>"$summary"
    failed=1
  fi
  return $rc
}

note "fsdpmon gpu-check $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" = 0 ]; then
  note "SKIP all: no GPU here (nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists none' \
    || echo 'not found')); nothing CUDA was checked"
  exit 0
fi
note "GPUs: $gpus ($(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1))"

# 1. setup: the project's own script; torch from what pip resolves (CUDA on a stock pip) unless
# TORCH_INDEX_URL says otherwise. Offline with a system CUDA torch: the venv reuses it.
if [ ! -x .venv/bin/python ] && python3 -c 'import torch; assert torch.cuda.is_available()' \
    2>/dev/null; then
  export FSDPMON_VENV_SYSTEM_SITE=1
fi
export TORCH_INDEX_URL="${TORCH_INDEX_URL:-default}" FSDPMON_NO_APT=1
step setup 420 bash scripts/setup.sh --test || { note "setup failed; nothing else run"; exit 1; }
step cuda 60 .venv/bin/python -W ignore - <<'PY' || { note "no CUDA torch; nothing else run"; exit 1; }
import torch
assert torch.cuda.is_available(), (
    f"torch {torch.__version__} sees no CUDA device (a CPU build? delete .venv and rerun with "
    "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128)")
print(f"RESULT torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name()}")
PY

py=.venv/bin/python
sync_test=tests/test_monitor_timing.py::test_no_device_sync_outside_log_steps

# 2-3. the GPU-marked tests; the sync-debug test on its own line. -rs: a skip says why.
# Only the files that hold GPU tests are collected (collecting the whole suite costs a minute).
mapfile -t gpu_files < <(grep -l 'pytest.mark.gpu' tests/test_*.py)
step gpu-tests 240 "$py" -m pytest -q -p no:cacheprovider -rs -m gpu --deselect "$sync_test" \
  "${gpu_files[@]}"
step sync-debug 180 "$py" -m pytest -q -p no:cacheprovider -rs "$sync_test"

# 4. the exporter on real NVML: 3 scrapes, one gpu series set per GPU nvidia-smi lists.
step exporter 90 "$py" - "$gpus" <<'PY'
import re, shutil, socket, subprocess, sys, time, urllib.request
gpus = int(sys.argv[1])
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
proc = subprocess.Popen([".venv/bin/fsdpmon", "exporter", "--port", str(port),
                         "--listen-address", "127.0.0.1", "--interval", "1"])
try:
    url, bodies, deadline = f"http://127.0.0.1:{port}/metrics", [], time.monotonic() + 40
    while len(bodies) < 3 and time.monotonic() < deadline:
        assert proc.poll() is None, f"exporter exited {proc.returncode}"
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
        except OSError:
            time.sleep(0.5); continue
        if "fsdpmon_gpu_" in body:
            bodies.append(body); time.sleep(1.1)
        else:
            time.sleep(0.3)
    assert len(bodies) == 3, f"{len(bodies)} of 3 scrapes had GPU series within 40 s"
    seen = set(re.findall(r'^fsdpmon_gpu_info\{[^}]*gpu="(\d+)"', bodies[-1], re.M))
    assert len(seen) == gpus, f"exporter shows GPUs {sorted(seen)}, nvidia-smi lists {gpus}"
    assert 'simulated="true"' not in bodies[-1], "the exporter fell back to simulated GPUs"
    names = sorted({m for m in re.findall(r"^(fsdpmon_gpu_\w+)", bodies[-1], re.M)})
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=bodies[-1], text=True,
                               capture_output=True)
        assert check.returncode == 0, check.stdout + check.stderr
    print(f"RESULT {len(seen)} GPUs, {len(names)} gpu metric names, 3 scrapes"
          + ("" if shutil.which("promtool") else " (no promtool: exposition not linted)"))
    print("\n".join(names))
finally:
    proc.terminate(); proc.wait(timeout=10)
PY

# 5. CPU offload on the GPU: sharded parameters in host memory, tiny model.
step cpu-offload 180 "$py" -m torch.distributed.run --standalone --nproc_per_node 1 \
  -m fsdpmon.trainer.train --model tiny --cpu-offload --max-steps 10 --log-every 5 --metrics-port 0

# 6. llama2-7b-shaped training on one GPU, layers reduced: tokens/s and MFU.
step train-7b-shape 300 bash -c "set -o pipefail; $py benchmarks/bench_trainer.py --skip-cpu \
  --gpu-layers ${GPU_LAYERS:-8} --timeout 280 | sed 's/^CUDA /RESULT /' | tee /dev/stderr \
  | grep '^RESULT ' >/dev/null"

note "total $((SECONDS - start_all))s; $([ $failed = 0 ] && echo 'all passed' || echo 'FAILURES above')"
exit $failed
