"""Trainer throughput: tokens/s of `tiny` and a ~100M custom model with 1 and 2 CPU ranks.

Each configuration runs the real trainer under torchrun (``--repeats`` times, interleaved so
machine load hits all alike); tokens/s comes from the trainer's own JSONL log (the monitor's
per-rank figure over each log window), excluding the first window (warm-up). Printed: the
median job tokens/s (sum over ranks), per rank, and the 2-rank/1-rank ratio side by side.

On a CUDA machine it also measures tokens/s per GPU and MFU for a llama2-7b-shaped model with
its layers reduced to fit one GPU.

    python benchmarks/bench_trainer.py [--repeats 3] [--skip-100m]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fsdpmon.trainer.config import model_args_for, parse_config
from fsdpmon.trainer.model import Transformer, count_parameters

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    label: str
    flags: tuple[str, ...]

    @property
    def params(self) -> str:
        """Counted from the model the flags build (on the meta device), not typed in."""
        args = model_args_for(parse_config([*self.flags, "--metrics-port", "0"]))
        with torch.device("meta"):
            return f"{count_parameters(Transformer(args)) / 1e6:.1f}M"


TINY = Case("tiny", ("--model", "tiny", "--batch-size", "8", "--seq-len", "128",
                     "--max-steps", "40", "--log-every", "10"))
M100 = Case("custom ~100M", ("--model", "custom", "--dim", "768", "--n-layers", "12",
                             "--n-heads", "12", "--n-kv-heads", "12", "--ffn-dim", "2048",
                             "--vocab-size", "8192", "--batch-size", "1", "--seq-len", "128",
                             "--max-steps", "8", "--log-every", "2"))


def run_trainer(flags: tuple[str, ...], nproc: int, timeout: float,
                cpu: bool = True, threads: int = 1) -> list[dict]:
    """One torchrun of the trainer; returns rank 0's and others' step records (after warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / "run.jsonl"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(nproc), "-m", "fsdpmon.trainer.train", *flags,
               "--metrics-port", "0", "--log-jsonl", str(jsonl), "--lr", "1e-3"]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        if cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode != 0:
            raise RuntimeError(f"trainer failed ({proc.returncode}):\n{err[-3000:]}")
        records = []
        for rank in range(nproc):
            lines = (Path(tmp) / f"run.rank{rank}.jsonl").read_text().splitlines()
            steps = [json.loads(x) for x in lines if x.strip()]
            records.extend(r for r in steps if r["kind"] == "step")
        first = min(r["step"] for r in records)
        return [r for r in records if r["step"] != first]


def job_tokens_per_second(records: list[dict], nproc: int) -> float:
    """Sum over ranks of each rank's median tokens/s over the measured windows."""
    per_rank = [statistics.median(r["tokens_per_second"] for r in records if r["rank"] == k)
                for k in range(nproc)]
    return sum(per_rank)


def measure(case: Case, repeats: int, timeout: float, threads: int) -> dict[int, list[float]]:
    results: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(repeats):
        for nproc in (1, 2):  # interleaved, so drifting load affects both alike
            records = run_trainer(case.flags, nproc, timeout, threads=threads)
            results[nproc].append(job_tokens_per_second(records, nproc))
    return results


def print_cpu_table(rows: list[tuple[Case, dict[int, list[float]]]], threads: int) -> None:
    print(f"\nCPU ({os.cpu_count()} cores), {torch.__version__}, {threads} thread(s) per rank; "
          "median of runs, job tokens/s = sum over ranks")
    print(f"{'model':<14} {'params':>7} {'1 rank tok/s':>13} {'2 ranks tok/s':>14} "
          f"{'per rank':>9} {'2r/1r':>6}  runs")
    for case, res in rows:
        one, two = statistics.median(res[1]), statistics.median(res[2])
        print(f"{case.label:<14} {case.params:>7} {one:>13,.0f} {two:>14,.0f} {two / 2:>9,.0f} "
              f"{two / one:>6.2f}  1r={[round(x) for x in res[1]]} 2r={[round(x) for x in res[2]]}")


def cuda_7b_shaped(layers: int, timeout: float) -> None:
    flags = ("--model", "llama2-7b", "--n-layers", str(layers), "--batch-size", "1",
             "--seq-len", "4096", "--max-steps", "12", "--log-every", "4",
             "--activation-checkpointing")
    records = run_trainer(flags, 1, timeout, cpu=False)
    tps = statistics.median(r["tokens_per_second"] for r in records)
    mfus = [r["mfu"] for r in records if r.get("mfu") is not None]
    mfu = f"{statistics.median(mfus):.1%}" if mfus else "n/a (GPU not in the peak table)"
    print(f"\nCUDA {torch.cuda.get_device_name()}: llama2-7b shape, {layers} layers, bf16, "
          f"seq 4096: {tps:,.0f} tokens/s per GPU, MFU {mfu}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-100m", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--gpu-layers", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--threads-per-rank", type=int, default=1,
                    help="OMP_NUM_THREADS of each rank (1: ranks do not fight over cores)")
    args = ap.parse_args()
    if not args.skip_cpu:
        cases = [TINY] if args.skip_100m else [TINY, M100]
        threads = args.threads_per_rank
        print_cpu_table([(case, measure(case, args.repeats, args.timeout, threads))
                         for case in cases], threads)
    if torch.cuda.is_available():
        cuda_7b_shaped(args.gpu_layers, args.timeout)
    else:
        print("\nno CUDA device: skipped the llama2-7b-shaped GPU measurement")


if __name__ == "__main__":
    main()
