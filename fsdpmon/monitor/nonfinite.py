"""Where a NaN was born: the first step at which this rank's loss, and its gradient norm, became
non-finite, and the batch it trained on at that step.

Why per step, and per rank: in FSDP a NaN born in one rank's logits at step S is in that rank's
loss at step S, in every rank's gradients (and so grad norm) at step S through the
reduce-scatter, and in every rank's loss from step S+1 on; a log step every N steps sees only
the aftermath, every rank alike. So each rank remembers its own first non-finite loss and grad
norm with their step and batch; `fsdpmon diagnose` compares them across ranks (the loss comes
before the gradients within a step).

Cost: per step, the values the loop handed over (tensors detached, left on the device: no
sync) go into a list; at the log step they are read together (on CUDA after the one sync the
log step already makes). Once both firsts are known nothing more is kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fsdpmon.monitor.records import as_float

WATCHED = ("loss", "grad_norm")  # in the order a step makes them
# Steps kept between log steps at most: a loop whose log steps are further apart (or that never
# logs) has them read when this many have gathered (on CUDA, one sync then).
MAX_KEPT_STEPS = 4096


@dataclass(frozen=True)
class FirstNonfinite:
    what: str  # "loss" or "grad_norm"
    step: int
    value: str  # "nan", "inf" or "-inf"
    batch: Any  # what the loop handed over as the step's batch (its loader position), or None

    def as_record(self, rank: int, local_rank: int, when: float) -> dict[str, Any]:
        return {"kind": "nonfinite", "time": when, "rank": rank, "local_rank": local_rank,
                "what": self.what, "step": self.step, "value": self.value, "batch": self.batch}


class NonfiniteWatch:
    def __init__(self) -> None:
        self.first: dict[str, FirstNonfinite] = {}
        self._steps: list[tuple[int, Any, Any, Any]] = []  # (step, loss, grad norm, batch)
        self._found: list[FirstNonfinite] = []  # found before the log step that reports them

    def step_done(self, step: int, values: dict[str, Any]) -> None:
        """``values``: what the loop recorded during this step (training thread, per step)."""
        if len(self.first) == len(WATCHED) or not values:
            return
        loss, grad = values.get("loss"), values.get("grad_norm")
        if loss is None and grad is None:
            return
        self._steps.append((step, _kept(loss), _kept(grad), values.get("batch")))
        if len(self._steps) >= MAX_KEPT_STEPS:
            self._found += self._read()

    def scan(self) -> list[FirstNonfinite]:
        """The firsts found among the steps since the last scan (log step)."""
        found, self._found = [*self._found, *self._read()], []
        return found

    def _read(self) -> list[FirstNonfinite]:
        steps, self._steps = self._steps, []
        found = []
        for index, what in enumerate(WATCHED, start=1):
            if what in self.first:
                continue
            mine = [s for s in steps if s[index] is not None]
            for entry, value in zip(mine, _floats([s[index] for s in mine]), strict=True):
                if not math.isfinite(value):
                    first = FirstNonfinite(what, entry[0], _text(value), entry[3])
                    self.first[what] = first
                    found.append(first)
                    break
        return found

    def first_step(self, what: str) -> int | None:
        first = self.first.get(what)
        return None if first is None else first.step


def _kept(value: Any) -> Any:
    """A tensor detached (a loss handed over with its graph must not keep the graph alive)."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return value.detach()
    return value


def _floats(values: Sequence[Any]) -> list[float]:
    """Every value as a float: device tensors stacked and moved in one transfer (one read per
    value would be a sync each), anything else one by one (a DTensor gathers its shards)."""
    if _one_transfer(values):
        return [float(x) for x in torch.stack([v.reshape(()) for v in values]).float().tolist()]
    return [as_float(v) for v in values]  # type: ignore[misc]  # no None among them


def _one_transfer(values: Sequence[Any]) -> bool:
    """Whether the values can be read in one transfer: every one a plain one-element tensor,
    all on the same device, not the CPU (CPU values cost no sync to read one by one)."""
    return all(type(v) is torch.Tensor and v.device.type != "cpu" and v.numel() == 1
               for v in values) and len({v.device for v in values}) == 1


def _text(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
