"""GPU faults on simulated GPUs: what each fault makes a GPU report, as a function of time.

``fsdpmon exporter --simulate-gpus N --fault KIND:...`` (or ``FSDPMON_FAULT``) uses the one
fault grammar of :mod:`fsdpmon.faultspec`; the exporter acts on the GPU kinds and leaves the
trainer's kinds to the trainer. Each fault starts ``after`` seconds from the exporter's start
and shows what NVML shows on real hardware:

- ``gpu-throttle``: clocks at most half the maximum ("HW slowdown reduces the core clocks by a
  factor of 2 or more", NVML's clock-event reasons), with the ``hw_slowdown`` bit and, for
  thermal or power, ``hw_thermal_slowdown`` / ``hw_power_brake_slowdown`` beside it; the
  GPU stays busy (utilisation near 1: its kernels take longer) while its power falls, and a
  thermal slowdown runs hot. NVML's accumulated clock-event time grows for the reasons it counts.
- ``xid``: one XID event of the code, once.
- ``gpu-lost``: the GPU stops answering (NVML's GpuIsLost: ``gpu_up`` 0, no values, its
  processes gone) after the driver's XID 79 "fallen off the bus"; the others go on.
- ``ecc-uncorrected``: one uncorrectable (volatile) ECC error, a row remapping pending until the
  GPU is reset, and XID 94 (contained ECC error), as Ampere and Hopper report it.

Pure: no clock and no I/O here; the simulated reader asks for a GPU's state at its elapsed time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from fsdpmon import faultspec
from fsdpmon.errors import ConfigError

XID_FALLEN_OFF_BUS = 79
XID_CONTAINED_ECC = 94


@dataclass(frozen=True)
class Throttle:
    reasons: tuple[str, ...]  # NVML clock-event reasons set while it lasts
    clock_ratio: float  # SM clock / max SM clock
    power_ratio: float  # power draw / power limit
    temperature_celsius: float | None  # None: the GPU's normal temperature


# hw_slowdown halves the clocks or more; thermal runs at the slowdown temperature (~90 C on
# H100), a power brake draws little.
THROTTLES = {
    "thermal": Throttle(("hw_slowdown", "hw_thermal_slowdown"), 0.45, 0.45, 92.0),
    "power": Throttle(("hw_slowdown", "hw_power_brake_slowdown"), 0.4, 0.3, None),
    "hw_slowdown": Throttle(("hw_slowdown",), 0.5, 0.45, None),
}


@dataclass(frozen=True)
class GpuFaultState:
    """What the faults make of one GPU at one instant."""

    throttle: Throttle | None = None
    throttle_since: float = 0.0  # seconds from the start when the throttle began
    lost: bool = False
    ecc_uncorrected: int = 0
    xids: dict[int, int] = field(default_factory=dict)  # XID code -> events so far


HEALTHY = GpuFaultState()


class GpuFaults:
    """The GPU faults of one exporter, checked against its GPU count at start."""

    def __init__(self, faults: Iterable[faultspec.Fault], gpu_count: int,
                 source: str = "--fault") -> None:
        self.faults = tuple(f for f in faults if isinstance(f, faultspec.GPU_KINDS))
        for fault in self.faults:
            if fault.gpu >= gpu_count:
                raise ConfigError(source, f"{faultspec.describe(fault)} names GPU {fault.gpu}, "
                                          f"but only {gpu_count} GPUs are simulated")

    def __bool__(self) -> bool:
        return bool(self.faults)

    def state(self, gpu: int, elapsed_s: float) -> GpuFaultState:
        active = [f for f in self.faults if f.gpu == gpu and elapsed_s >= f.after]
        if not active:
            return HEALTHY
        xids: dict[int, int] = {}
        throttle, since, lost, ecc = None, 0.0, False, 0
        for fault in active:
            code = None
            if isinstance(fault, faultspec.GpuThrottle):
                throttle, since = THROTTLES[fault.reason], float(fault.after)
            elif isinstance(fault, faultspec.Xid):
                code = int(fault.code)
            elif isinstance(fault, faultspec.GpuLost):
                lost, code = True, XID_FALLEN_OFF_BUS
            elif isinstance(fault, faultspec.EccUncorrected):
                ecc, code = ecc + 1, XID_CONTAINED_ECC
            if code is not None:
                xids[code] = xids.get(code, 0) + 1
        return GpuFaultState(throttle, since, lost, ecc, xids)


def exporter_faults(flag: str | None, gpu_count: int) -> GpuFaults:
    """The GPU faults from ``FSDPMON_FAULT`` and ``--fault``; a bad spec is a ConfigError.

    ``FSDPMON_FAULT`` may also hold the trainer's kinds (the demo sets it for both): they are
    ignored here. The flag is the exporter's own, so a trainer kind in it is a mistake."""
    from_flag = faultspec.parse(flag, "--fault")
    wrong = [f for f in from_flag if not isinstance(f, faultspec.GPU_KINDS)]
    if wrong:
        raise ConfigError("--fault", f"{faultspec.kind_of(wrong[0])} is a trainer fault; the "
                                     "exporter injects gpu-throttle, xid, gpu-lost and "
                                     "ecc-uncorrected")
    from_env = faultspec.parse(os.environ.get(faultspec.ENV_VAR), faultspec.ENV_VAR)
    faults = []
    for source, given in ((faultspec.ENV_VAR, from_env), ("--fault", from_flag)):
        gpu = [f for f in given if isinstance(f, faultspec.GPU_KINDS)]
        if gpu and gpu_count <= 0:
            raise ConfigError(source, "GPU faults are injected into simulated GPUs only: add "
                                      "--simulate-gpus N")
        faults += GpuFaults(gpu, gpu_count, source).faults  # each checked, named by its source
    return GpuFaults(faults, gpu_count)
