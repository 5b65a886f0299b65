"""The in-trainer monitor: step time, tokens/s, MFU, memory, loss and stalls, to Prometheus.

Two lines in any training loop::

    mon = Monitor(MonitorConfig.from_env(), model=model, seq_len=seq_len, tokens_per_step=n)
    for batch in data:
        with mon.step():
            ...
            mon.record(loss=loss.detach(), lr=lr, grad_norm=gn)
    mon.close()
"""

from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.monitor import Monitor

__all__ = ["Monitor", "MonitorConfig"]
