"""The in-trainer monitor: step time, tokens/s, MFU, memory, loss and stalls, to Prometheus.

Two lines in any training loop::

    mon = Monitor(MonitorConfig.from_env(), model=model, seq_len=seq_len, tokens_per_step=n)
    for batch in data:
        with mon.step():
            ...
            mon.record(loss=loss.detach(), lr=lr, grad_norm=gn)
    mon.close()

``Monitor`` is imported on first use: the pod's server process (``fsdpmon.monitor.podserver``)
lives in this package too and must start without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpmon.monitor.config import MonitorConfig
    from fsdpmon.monitor.monitor import Monitor

__all__ = ["Monitor", "MonitorConfig"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from fsdpmon.monitor.monitor import Monitor

        return Monitor
    if name == "MonitorConfig":
        from fsdpmon.monitor.config import MonitorConfig

        return MonitorConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
