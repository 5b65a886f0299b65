"""Recording rules that map dcgm-exporter's standard metrics onto the catalog's GPU metrics.

Clusters that already run NVIDIA's dcgm-exporter get the fsdpmon dashboards and GPU alerts
without the fsdpmon exporter: each rule converts one DCGM field to the catalog's base unit and
label names (``UUID`` -> ``uuid``, ``modelName`` -> ``model``, ``Hostname`` -> ``node``), and
records it under the catalogued name. dcgm-exporter's ``namespace``/``pod``/``container`` labels
pass through unchanged, so scrape it with ``honorLabels: true`` (as the fsdpmon exporter).

GPUs that the fsdpmon exporter also reports are skipped (``unless on (uuid)``), so running both
never double-counts. dcgm-exporter has no XID counter (``DCGM_FI_DEV_XID_ERRORS`` holds the last
XID code), so XIDs map to ``fsdpmon_gpu:dcgm_xid_errors:changes``, which the XID alert reads too.
"""

from __future__ import annotations

from typing import Any

from fsdpmon import catalog
from fsdpmon.catalog import Metric
from fsdpmon.conventions import GPU_CLOCK_EVENT_BITS
from fsdpmon.dashboards.promql import m

MIB = 1024 * 1024

# (DCGM field, catalogued metric, factor to the base unit, extra label or None)
FIELD_MAP: tuple[tuple[str, Metric, float, tuple[str, str] | None], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", catalog.GPU_UTILIZATION_RATIO, 0.01, None),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", catalog.GPU_MEMORY_UTILIZATION_RATIO, 0.01, None),
    ("DCGM_FI_DEV_FB_USED", catalog.GPU_MEMORY_USED_BYTES, MIB, None),
    ("DCGM_FI_DEV_FB_FREE", catalog.GPU_MEMORY_FREE_BYTES, MIB, None),
    ("DCGM_FI_DEV_FB_RESERVED", catalog.GPU_MEMORY_RESERVED_BYTES, MIB, None),
    ("DCGM_FI_DEV_GPU_TEMP", catalog.GPU_TEMPERATURE_CELSIUS, 1, None),
    ("DCGM_FI_DEV_MEMORY_TEMP", catalog.GPU_MEMORY_TEMPERATURE_CELSIUS, 1, None),
    ("DCGM_FI_DEV_POWER_USAGE", catalog.GPU_POWER_WATTS, 1, None),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", catalog.GPU_POWER_LIMIT_WATTS, 1, None),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", catalog.GPU_ENERGY_JOULES_TOTAL, 0.001, None),
    ("DCGM_FI_DEV_SM_CLOCK", catalog.GPU_SM_CLOCK_HERTZ, 1e6, None),
    ("DCGM_FI_DEV_MEM_CLOCK", catalog.GPU_MEMORY_CLOCK_HERTZ, 1e6, None),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", catalog.GPU_PCIE_REPLAY_ERRORS_TOTAL, 1, None),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", catalog.GPU_ECC_ERRORS_TOTAL, 1, ("type", "corrected")),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", catalog.GPU_ECC_ERRORS_TOTAL, 1,
     ("type", "uncorrected")),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", catalog.GPU_REMAPPED_ROWS, 1,
     ("cause", "correctable")),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", catalog.GPU_REMAPPED_ROWS, 1,
     ("cause", "uncorrectable")),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", catalog.GPU_REMAPPED_ROWS, 1, ("cause", "failure")),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", catalog.GPU_PCIE_BYTES_PER_SECOND, 1, ("direction", "tx")),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", catalog.GPU_PCIE_BYTES_PER_SECOND, 1, ("direction", "rx")),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", catalog.GPU_NVLINK_BYTES_PER_SECOND, 1,
     ("direction", "tx")),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", catalog.GPU_NVLINK_BYTES_PER_SECOND, 1,
     ("direction", "rx")),
    ("DCGM_FI_PROF_SM_ACTIVE", catalog.GPU_SM_ACTIVITY_RATIO, 1, None),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", catalog.GPU_TENSOR_ACTIVITY_RATIO, 1, None),
)

# NVML clock-event reason bits, as dcgm-exporter exports them in one bitmask: the reasons the
# alerts and panels read get a series each; the bitmask itself is recorded whole for top.
THROTTLE_BITS = {reason: GPU_CLOCK_EVENT_BITS[reason] for reason in (
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
    "hw_power_brake_slowdown")}
THROTTLE_FIELD = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"

_DCGM_ONLY_LABELS = "UUID, modelName, Hostname, device, DCGM_FI_DRIVER_VERSION, pci_bus_id"


def relabel(expr: str) -> str:
    """dcgm-exporter's label names -> the catalog's, dropping what the catalog lacks."""
    for dst, src in (("uuid", "UUID"), ("model", "modelName"), ("node", "Hostname")):
        expr = f'label_replace({expr}, "{dst}", "$1", "{src}", "(.*)")'
    return f"max without ({_DCGM_ONLY_LABELS}) ({expr})"


def _not_ours(expr: str) -> str:
    return f"{expr}\nunless on (uuid) {m(catalog.GPU_INFO)}"


def _mapped(target: Metric, expr: str, label: tuple[str, str] | None) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": m(target), "expr": _not_ours(relabel(expr))}
    if label is not None:  # a rule label keeps each field a distinct series of one metric
        rule["labels"] = dict([label])
    return rule


def _xid_changed(window: str) -> str:
    """Changes of the last-XID field, or a series born within ``window`` with an XID in it.

    ``changes()`` of a series whose first sample already holds XID 79 is 0; the second arm
    catches it (its value is then the code, still > 0, which is all the alert asks)."""
    xid = "DCGM_FI_DEV_XID_ERRORS"
    return f"changes({xid}[{window}]) > 0 or ({xid} > 0 unless {xid} offset {window})"


def dcgm_rules(xid_window: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for field, target, factor, label in FIELD_MAP:
        scaled = field if factor == 1 else f"{field} * {factor:.12g}"
        rules.append(_mapped(target, scaled, label))
    for reason, bit in THROTTLE_BITS.items():
        bit_set = f"floor({THROTTLE_FIELD} / {bit}) % 2"
        rules.append(_mapped(catalog.GPU_CLOCK_EVENT_ACTIVE, bit_set, ("reason", reason)))
    rules.append(_mapped(catalog.GPU_CLOCK_EVENT_REASONS, THROTTLE_FIELD, None))
    rules.append({
        "record": catalog.REC_GPU_DCGM_XID_ERRORS_CHANGES.name,
        "expr": _not_ours(relabel(_xid_changed(xid_window))),
    })
    # the code itself, for the XID alert's severity (critical codes page as critical)
    rules.append({"record": catalog.REC_GPU_DCGM_XID_ERRORS_LAST.name,
                  "expr": _not_ours(relabel("DCGM_FI_DEV_XID_ERRORS"))})
    return rules


def source_metrics() -> set[str]:
    """Every dcgm-exporter metric the mapping reads (the test allows exactly these)."""
    return {f for f, *_ in FIELD_MAP} | {THROTTLE_FIELD, "DCGM_FI_DEV_XID_ERRORS"}
