"""The one fault-injection grammar: ``KIND[:key=value[,key=value...]]``, several joined by ``;``.

Tests, benchmarks and ``fsdpmon demo --fault`` make real failures happen through this one
mechanism: the trainer reads ``FSDPMON_FAULT`` and its ``--fault`` flag, the simulated exporter
reads ``FSDPMON_FAULT`` and its own ``--fault``. Nothing here acts; it only parses, into frozen
dataclasses, and every consumer asks for the kinds it implements. Unset means no fault at all.

A bad spec fails at start with one ``ConfigError`` line naming the spec, the kind and the key.
Bottom layer: imports only ``fsdpmon.errors`` (itself bottom layer).

Kinds and keys (a key left out takes the default shown; ``rank``/``gpu`` default to 0):
  compute-slow:rank=R,factor=F,from_step=S,after=T
                                                rank R's forward/backward F times slower
  data-slow:rank=R,seconds=X,from_step=S,after=T,until_step=U
                                                rank R's loader X s slower per batch (for
                                                steps S..U; U=0: to the end)
  hang:rank=R,at_step=S,where=data|host|gil,after=T,gate=PATH
                                                rank R blocks forever outside any collective
                                                (at step S, or the first step past it that
                                                is T seconds after the rank's first step and,
                                                with gate, once PATH exists): in Python
                                                (data, host) or in a C call that holds the
                                                GIL (gil: no thread of it runs Python)
  nonfinite-loss:rank=R,from_step=S,value=nan|inf|-inf
  checkpoint-slow:rank=R,seconds=X,from_step=S,after=T
                                                rank R's saves X s longer
  (from_step and after: from step S, and not before T seconds after the rank's first step)
  crash:rank=R,at_step=S                        SIGKILL at step S, first attempt only
  crash-in-save:rank=R,at_step=S                SIGKILL inside the save of step S (files
                                                written, not committed), first attempt only
  pause:at_step=S,dir=PATH                      every rank holds still after step S (first
                                                attempt) and writes PATH/pause.rank{r}
  gpu-throttle:gpu=G,after=SECONDS,reason=thermal|power|hw_slowdown
  xid:gpu=G,code=C,after=SECONDS
  gpu-lost:gpu=G,after=SECONDS
  ecc-uncorrected:gpu=G,after=SECONDS
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fsdpmon.errors import ConfigError

ENV_VAR = "FSDPMON_FAULT"


@dataclass(frozen=True)
class ComputeSlow:
    rank: int = 0
    factor: float = 1.5  # the rank's compute takes factor x its own measured time
    from_step: int = 0
    after: float = 0.0  # seconds after the rank's first step


@dataclass(frozen=True)
class DataSlow:
    rank: int = 0
    seconds: float = 0.05  # added to each batch this rank loads
    from_step: int = 0
    after: float = 0.0
    until_step: int = 0  # the last step slowed (0: every step from from_step on)


@dataclass(frozen=True)
class Hang:
    rank: int = 0
    at_step: int = 5
    where: str = "data"  # "data": inside next(loader); "host"/"gil": a call after the step
    after: float = 0.0  # and not before this many seconds after the rank's first step
    gate: str = ""  # and not before this file exists ("": no gate): a test's "now", not a clock


@dataclass(frozen=True)
class NonfiniteLoss:
    rank: int = 0
    from_step: int = 0
    value: str = "nan"


@dataclass(frozen=True)
class CheckpointSlow:
    rank: int = 0
    seconds: float = 5.0
    from_step: int = 0  # saves of this step and later
    after: float = 0.0


@dataclass(frozen=True)
class Crash:
    rank: int = 0
    at_step: int = 5


@dataclass(frozen=True)
class CrashInSave:
    rank: int = -1  # -1: the last rank
    at_step: int = 0


@dataclass(frozen=True)
class Pause:
    at_step: int = 0
    dir: str = "."


@dataclass(frozen=True)
class GpuThrottle:
    gpu: int = 0
    after: float = 0.0
    reason: str = "thermal"


@dataclass(frozen=True)
class Xid:
    gpu: int = 0
    code: int = 79
    after: float = 0.0


@dataclass(frozen=True)
class GpuLost:
    gpu: int = 0
    after: float = 0.0


@dataclass(frozen=True)
class EccUncorrected:
    gpu: int = 0
    after: float = 0.0


KINDS: dict[str, type] = {
    "compute-slow": ComputeSlow, "data-slow": DataSlow, "hang": Hang,
    "nonfinite-loss": NonfiniteLoss, "checkpoint-slow": CheckpointSlow, "crash": Crash,
    "crash-in-save": CrashInSave, "pause": Pause,
    "gpu-throttle": GpuThrottle, "xid": Xid, "gpu-lost": GpuLost,
    "ecc-uncorrected": EccUncorrected,
}
TRAINER_KINDS = (ComputeSlow, DataSlow, Hang, NonfiniteLoss, CheckpointSlow, Crash,
                 CrashInSave, Pause)
GPU_KINDS = (GpuThrottle, Xid, GpuLost, EccUncorrected)

# Allowed words for the string-valued keys; every other key is a number.
CHOICES: dict[tuple[type, str], tuple[str, ...]] = {
    (Hang, "where"): ("data", "host", "gil"),
    (NonfiniteLoss, "value"): ("nan", "inf", "-inf"),
    (GpuThrottle, "reason"): ("thermal", "power", "hw_slowdown"),
}
# Lower bounds (inclusive) per key name; rank -1 is only meaningful for crash-in-save.
MINIMUM: dict[str, float] = {"rank": 0, "gpu": 0, "from_step": 0, "at_step": 0,
                             "seconds": 0, "after": 0, "factor": 1, "code": 1}

Fault = Any  # one of the dataclasses above
T = TypeVar("T")


def kind_of(fault: Fault) -> str:
    return next(name for name, cls in KINDS.items() if isinstance(fault, cls))


def _bad(source: str, spec: str, problem: str) -> ConfigError:
    return ConfigError(source, f"bad fault spec {spec!r}: {problem}")


def _value(cls: type, key: str, text: str, kind: str, fail) -> object:
    field_type = {f.name: f.type for f in dataclasses.fields(cls)}[key]
    choices = CHOICES.get((cls, key))
    if choices is not None:
        if text not in choices:
            raise fail(f"{kind} {key} must be one of {'|'.join(choices)}, got {text!r}")
        return text
    if field_type == "str":
        if not text:
            raise fail(f"{kind} {key} is empty")
        return text
    try:
        number = int(text) if field_type == "int" else float(text)
    except ValueError:
        raise fail(f"{kind} {key} must be {'an integer' if field_type == 'int' else 'a number'}"
                   f", got {text!r}") from None
    low = -1 if (cls is CrashInSave and key == "rank") else MINIMUM.get(key)
    if number != number or number in (float("inf"), float("-inf")):
        raise fail(f"{kind} {key} must be finite, got {text!r}")
    if low is not None and number < low:
        raise fail(f"{kind} {key} must be >= {low:g}, got {text!r}")
    return number


def parse_one(spec: str, source: str = ENV_VAR) -> Fault:
    """One ``KIND[:key=value,...]`` into its dataclass; ConfigError(source) naming what is wrong."""
    text = spec.strip()
    kind, _, rest = text.partition(":")
    kind = kind.strip()

    def fail(problem: str) -> ConfigError:
        return _bad(source, text, problem)

    cls = KINDS.get(kind)
    if cls is None:
        raise fail(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq:
            raise fail(f"expected key=value, got {item!r}")
        if key not in names:
            raise fail(f"{kind} has no key {key!r} (keys: {', '.join(names)})")
        if key in values:
            raise fail(f"{kind} key {key!r} given twice")
        values[key] = _value(cls, key, raw, kind, fail)
    return cls(**values)


def parse(text: str | None, source: str = ENV_VAR) -> tuple[Fault, ...]:
    """The whole spec (``;``-separated); empty or None means no fault."""
    if not text or not text.strip():
        return ()
    return tuple(parse_one(part, source) for part in text.split(";") if part.strip())


def from_sources(flag: str | None = None, environ: Mapping[str, str] | None = None,
                 flag_name: str = "--fault") -> tuple[Fault, ...]:
    """Faults from ``FSDPMON_FAULT`` then the command's flag (both apply; each named on error)."""
    env = os.environ if environ is None else environ
    return parse(env.get(ENV_VAR), ENV_VAR) + parse(flag, flag_name)


def select(faults: Iterable[Fault], cls: type[T], rank: int | None = None,
           world_size: int = 1) -> list[T]:
    """The faults of one kind, for one rank when ``rank`` is given (rank -1 = the last rank)."""
    def aimed(f: Fault) -> bool:
        target = getattr(f, "rank", rank)
        return rank is None or target == rank or (target == -1 and rank == world_size - 1)
    return [f for f in faults if isinstance(f, cls) and aimed(f)]


def describe(fault: Fault) -> str:
    """Back to spec text, every key spelled out (for logs and the demo's banner) but an empty
    text, which is its key left out (no hang gate)."""
    pairs = ",".join(f"{k}={v}" for k, v in dataclasses.asdict(fault).items() if v != "")
    return f"{kind_of(fault)}:{pairs}"
