"""A loopback stand-in for many pods: serves ``payloads[path]`` (mutable) with 200, else 404.

prometheus_client's server serves one registry per port; a benchmark of 512 pods needs one
process to answer for many, so this maps paths to pre-rendered expositions instead, and honours
``name[]`` as the monitor and the exporter do. On a 2-core machine the stand-in shares the CPU
with the `top` being measured, where real pods would not, so it spends as little as it can: one
thread, one selector loop, no thread per connection (a threaded server spent about three times
the CPU per refresh of 512 pods), HTTP/1.0 answers written without blocking, no header parsing.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from urllib.parse import parse_qsl

from fsdpmon.families import restrict

_HEAD_LIMIT = 65536  # request bytes before the blank line; more is not a request we serve


class _Exchange:
    """One connection: the request read so far, then the answer left to write."""

    __slots__ = ("answer", "request")

    def __init__(self) -> None:
        self.request = b""
        self.answer: memoryview | None = None


class PayloadServer:
    def __init__(self, payloads: dict[str, bytes], host: str = "127.0.0.1") -> None:
        self.payloads = payloads
        self.honour_names = True  # False: a server that ignores ``name[]`` (other exporters)
        self._restricted: dict[tuple[str, str], tuple[bytes, bytes]] = {}
        # One process answers for many pods, each of which would have its own listen queue:
        # a small backlog would drop concurrent SYNs (1 s retransmits).
        self._listener = socket.create_server((host, 0), backlog=1024)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake, self._woken = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._woken, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def restricted(self, path: str, body: bytes, query: str) -> bytes:
        """``body`` cut to the samples named by ``name[]`` in ``query``, as the monitor and the
        exporter answer it; cached per path and query while the body stays the same object."""
        cached = self._restricted.get((path, query))
        if cached is not None and cached[0] is body:
            return cached[1]
        names = {v for k, v in parse_qsl(query) if k == "name[]"}
        filtered = restrict(body, names) if names else body
        self._restricted[path, query] = (body, filtered)
        return filtered

    def answer(self, target: str) -> bytes:
        """The whole HTTP answer to a GET of ``target`` (path and query)."""
        path, _, query = target.partition("?")
        body = self.payloads.get(path)
        if body is not None and query and self.honour_names:
            body = self.restricted(path, body, query)
        status = b"200 OK" if body is not None else b"404 Not Found"
        body = b"not found\n" if body is None else body
        return (b"HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake.send(b"x")
        self._thread.join(timeout=5.0)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._wake.close()

    def _serve(self) -> None:
        while not self._stop:
            for key, _ in self._selector.select():
                if key.fileobj is self._listener:
                    self._accept()
                elif key.data is not None:
                    self._step(key.fileobj, key.data)  # type: ignore[arg-type]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or the listener closed: try on the next event
                return
            conn.setblocking(False)
            self._selector.register(conn, selectors.EVENT_READ, _Exchange())

    def _step(self, conn: socket.socket, exchange: _Exchange) -> None:
        try:
            if exchange.answer is None:
                chunk = conn.recv(65536)
                exchange.request += chunk
                head = exchange.request
                if not any(end in head for end in (b"\r\n\r\n", b"\n\n")):
                    if not chunk or len(head) > _HEAD_LIMIT:  # gone, or not a request
                        self._drop(conn)
                    return
                line = head.split(b"\n", 1)[0].split()
                target = line[1].decode("latin-1") if len(line) > 1 else ""
                exchange.answer = memoryview(self.answer(target))
                self._selector.modify(conn, selectors.EVENT_WRITE, exchange)
            sent = conn.send(exchange.answer)
            exchange.answer = exchange.answer[sent:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client went away
            self._drop(conn)
            return
        if not exchange.answer:
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        conn.close()
