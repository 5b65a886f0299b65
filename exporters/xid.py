"""XID error events: a background thread waiting on NVML's event set.

XIDs are events, not values, so polling them in the sampler would miss them; a thread blocks in
``nvmlEventSetWait`` (with a short timeout so it can stop) and counts each event into the reader,
which serves the counts as ``fsdpmon_gpu_xid_errors_total{xid="79"}``. This module uses the NVML
module the reader holds, so it never imports pynvml itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from fsdpmon.exporters.nvml import NvmlReader

log = logging.getLogger(__name__)

WAIT_MS = 500


class XidWatcher:
    """Counts XID critical-error events per GPU until ``stop()``."""

    def __init__(self, reader: NvmlReader) -> None:
        self.reader = reader
        self.nvml = reader.nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._index_by_uuid: dict[str, int] = {}

    def start(self) -> bool:
        """Register every GPU for XID events; False when none can be (nothing to watch)."""
        nv = self.nvml
        if self._thread is not None and self._thread.is_alive():
            return True
        if not self.reader.up:
            return False
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.warning("XID events unavailable: %s", exc)
            return False
        registered = 0
        for identity, handle in zip(self.reader.identities, self.reader.handles, strict=False):
            if handle is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError,
                                            self._event_set)
            except nv.NVMLError as exc:
                log.info("GPU %d: XID events not supported (%s)", identity.index, exc)
                continue
            self._index_by_uuid[identity.uuid] = identity.index
            registered += 1
        if not registered:
            self._free()
            return False
        self._thread = threading.Thread(target=self._run, name="fsdpmon-xid", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._free()

    def _free(self) -> None:
        if self._event_set is not None and (self._thread is None or not self._thread.is_alive()):
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def _run(self) -> None:
        nv = self.nvml
        while not self._stop.is_set():
            try:
                event = nv.nvmlEventSetWait(self._event_set, WAIT_MS)
            except nv.NVMLError_Timeout:
                continue
            except nv.NVMLError as exc:
                log.warning("XID event wait failed (%s); XID counting stops", exc)
                return
            self._record(event)

    def _record(self, event: Any) -> None:
        nv = self.nvml
        if not event.eventType & nv.nvmlEventTypeXidCriticalError:
            return
        try:
            uuid = nv.nvmlDeviceGetUUID(event.device)
        except nv.NVMLError:
            return
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        index = self._index_by_uuid.get(uuid)
        if index is not None:
            log.warning("GPU %d (%s): XID %d", index, uuid, event.eventData)
            self.reader.count_xid(index, int(event.eventData))
