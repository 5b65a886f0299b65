"""HTTP basic auth against bcrypt hashes, built so that guessing cannot be used to burn CPU.

bcrypt is slow by design (cost 10: ~80 ms of CPU per check), so, as the Prometheus
exporter-toolkit does:
- at most ``BCRYPT_AT_ONCE`` checks run at a time, and at most ``BCRYPT_WAITING`` requests wait
  for one; the rest are answered "busy" (429) after ``BUSY_DELAY_SECONDS`` (a sleep: no CPU, and
  a guesser cannot spin on it), so guessers can never occupy every worker of the server; after a
  failed check the slot stays taken for ``FAILED_PAUSE`` x its duration, so guessing takes at
  most 1 / (1 + FAILED_PAUSE) of one core, and the checks run in one thread at the lowest CPU
  priority (nice 19), so they only get the CPU that scrapes leave over;
- recent successes are cached (keyed by a SHA-256 of user, password and hash, never the password
  itself), so a scraper with good credentials pays bcrypt once, not per scrape; failures are not
  cached: a guesser sending a fresh password per request would otherwise evict the scraper's
  entry, send it back to the bcrypt queue that the guessers keep full, and get it answered 429;
- an unknown user or a password bcrypt cannot take (over 72 bytes) costs the same bcrypt time as
  a wrong password and is answered 401, so timing reveals neither.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import hashlib
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import bcrypt

BCRYPT_AT_ONCE = 1
BCRYPT_WAITING = 4
BUSY_DELAY_SECONDS = 1.0
FAILED_PAUSE = 0.25
CACHE_ENTRIES = 128
BCRYPT_MAX_PASSWORD_BYTES = 72


class Verdict(enum.Enum):
    OK = "ok"
    DENIED = "denied"
    BUSY = "busy"


class BasicAuth:
    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        # Unknown users are checked against a real hash of the same cost: same time.
        self._decoy = next(iter(users.values()))
        self._cache: OrderedDict[bytes, bool] = OrderedDict()  # successes, least recent first
        self._lock = threading.Lock()
        # One thread runs every check, at the lowest CPU priority (Linux nice is per thread):
        # guessing then only gets CPU the scrapes and the sampler leave over.
        self._checker = ThreadPoolExecutor(BCRYPT_AT_ONCE, thread_name_prefix="fsdpmon-bcrypt",
                                           initializer=_lowest_priority)
        self._admitted = threading.BoundedSemaphore(BCRYPT_AT_ONCE + BCRYPT_WAITING)
        self.bcrypt_checks = 0  # how many ran (tests and benchmarks read it)
        self.busy_delay = BUSY_DELAY_SECONDS

    def check(self, header: str | None) -> Verdict:
        credentials = _decode(header)
        if credentials is None:
            return Verdict.DENIED
        user, password = credentials
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password, hashed or b""))).digest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return Verdict.OK
        if not self._admitted.acquire(blocking=False):
            time.sleep(self.busy_delay)
            return Verdict.BUSY
        try:
            ok = self._checker.submit(self._paced_bcrypt, password, hashed).result()
        finally:
            self._admitted.release()
        if not ok:
            return Verdict.DENIED
        with self._lock:
            self._cache[key] = True
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return Verdict.OK

    def _paced_bcrypt(self, password: bytes, hashed: bytes | None) -> bool:
        started = time.monotonic()
        ok = self._bcrypt(password, hashed)
        if not ok:
            time.sleep(FAILED_PAUSE * (time.monotonic() - started))
        return ok

    def _bcrypt(self, password: bytes, hashed: bytes | None) -> bool:
        self.bcrypt_checks += 1
        usable = hashed is not None and len(password) <= BCRYPT_MAX_PASSWORD_BYTES
        try:
            matched = bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD_BYTES],
                                     hashed if hashed is not None else self._decoy)
        except ValueError:  # a hash bcrypt cannot read: validated at start, so not expected
            return False
        return usable and matched


def _lowest_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: as is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _decode(header: str | None) -> tuple[str, bytes] | None:
    if not header or not header.startswith("Basic "):
        return None
    try:
        raw = base64.b64decode(header[6:], validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None
