"""The HTTP server under `captioning-demo` (captioning/tools/demo.py): a fixed pool of handler threads, a cap on
open connections, and idle and read time-outs, so that one slow client or a burst cannot stop another's answer and
memory stays bounded.

The standard library's ThreadingHTTPServer starts one thread per connection and lets a client keep it for as long
as it sends a byte now and then. Here the thread in `serve_forever` (the dispatcher) accepts connections and
watches them with a selector until their first byte arrives: an idle connection costs a file descriptor, not a
thread, and is closed `timeout` seconds after it was opened. A connection with a byte to read goes to a queue that
`workers` threads take from (the queue is bounded by the cap: it never holds more than `max_connections`). A
connection over `max_connections` is answered 503 with a Retry-After header by the dispatcher, which never waits
on a client, and closed at once.

A worker reads its request through `DeadlineReader`: each read waits at most `timeout` seconds, and the whole
request (request line, headers and body) must arrive within `deadline` seconds of its start, so a client that
trickles one byte a second is dropped too; the answer is written with the socket's time-out (`sendall`: at most
`timeout` seconds in all). Every answer closes its connection (HTTP/1.0, as http.server answers by default), so no
worker waits between two requests of a client. A client thus holds a worker at most about `deadline` + `timeout`
seconds, plus what its handler waits for (the demo: its turn at the model, bounded by the demo's upload queue).
"""

from __future__ import annotations

import io
import json
import logging
import queue
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

from captioning.base.messages import one_line

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What bounds the demo server (its defaults are captioning-demo's): handler threads, open connections, seconds
    a connection may stay silent, seconds to receive one whole request, uploads waiting for the model."""

    workers: int = 24
    max_connections: int = 256
    timeout: float = 30.0
    deadline: float = 60.0
    queue: int = 16

    def __post_init__(self) -> None:
        for name in ("workers", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("timeout", "deadline"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.queue < 0:
            raise ValueError(f"queue must be >= 0, got {self.queue}")
        if self.workers < self.queue + 2:
            raise ValueError(f"--workers {self.workers} is too few for --queue {self.queue}: each upload waiting for "
                             f"the model and the one it decodes hold a worker, and one more must stay free to answer "
                             f"the others (use --workers {self.queue + 2} or more, or a smaller --queue)")


class DeadlineReader(io.RawIOBase):
    """The reading side of a socket: each read waits at most `timeout` seconds, and all of them end `deadline`
    seconds after this reader was made (TimeoutError saying which)."""

    def __init__(self, sock: socket.socket, timeout: float, deadline: float):
        self.sock, self.timeout, self.deadline = sock, timeout, deadline
        self.until = time.monotonic() + deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        left = self.until - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(min(self.timeout, left))
            return self.sock.recv_into(buffer)
        except TimeoutError:
            raise TimeoutError(f"the request did not arrive within {self.deadline:g} s (--deadline)"
                               if left < self.timeout else
                               f"the client sent nothing for {self.timeout:g} s (--timeout)") from None
        finally:
            self.sock.settimeout(self.timeout)  # the answer is written with the plain time-out


class BoundedHandler(BaseHTTPRequestHandler):
    """A request handler that reads its request through a DeadlineReader (the server's timeout and deadline)."""

    server: BoundedHTTPServer

    def setup(self) -> None:
        super().setup()
        limits = self.server.limits
        self.connection.settimeout(limits.timeout)  # for the answer; each read sets its own (DeadlineReader)
        self.rfile.close()  # the socket's plain file, replaced by one that keeps the deadline
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, limits.timeout, limits.deadline))


def busy_answer(message: str, retry_after: int) -> bytes:
    """A whole HTTP 503 answer with Retry-After and a JSON `error` body, that closes its connection."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode("utf-8")
    head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Retry-After: {retry_after}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


class BoundedHTTPServer(HTTPServer):
    """An HTTP server with `limits.workers` handler threads, at most `limits.max_connections` open connections,
    and idle and read time-outs (the module's docstring). `serve_forever()` in one thread, `shutdown()` from
    another, then `server_close()`."""

    def __init__(self, address: tuple[str, int], handler: type[BoundedHandler], limits: ServerLimits):
        self.limits = limits
        self.open_connections = 0  # accepted and not yet closed (the idle, the queued and those being handled)
        self.counting = threading.Lock()
        self.ready: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()  # for the workers
        self.idle: dict[socket.socket, tuple[Any, float]] = {}  # address and when to drop it; oldest first
        self.stopping, self.stopped = threading.Event(), threading.Event()
        self.stopped.set()
        # the kernel's queue of connections not yet accepted (socketserver's default is 5): a burst beyond it would
        # see its connections dropped or reset before the dispatcher could answer them, even a 503
        self.request_queue_size = max(5, min(limits.max_connections, socket.SOMAXCONN))
        super().__init__(address, handler)

    def retry_after(self) -> int:
        """Seconds a refused client is told to wait (the Retry-After header)."""
        return 1

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Start the workers, then accept and watch connections until shutdown()."""
        self.stopped.clear()
        self.socket.setblocking(False)  # accept() after the selector's word, never waiting for a client that left
        workers = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                   for i in range(self.limits.workers)]
        for worker in workers:
            worker.start()
        selector = selectors.DefaultSelector()
        selector.register(self.socket, selectors.EVENT_READ)
        try:
            while not self.stopping.is_set():
                oldest = next(iter(self.idle.values()), (None, float("inf")))[1]
                wait = max(0.0, min(poll_interval, oldest - time.monotonic()))
                for key, _ in selector.select(wait):
                    if key.fileobj is self.socket:
                        self._accept(selector)
                    else:  # its first byte: to a worker
                        conn = key.fileobj
                        assert isinstance(conn, socket.socket)
                        selector.unregister(conn)
                        self.ready.put((conn, self.idle.pop(conn)[0]))
                self._drop_idle(selector, time.monotonic())
        finally:
            self._drop_idle(selector, float("inf"))
            selector.close()
            for _ in workers:  # each ends after the connections queued before it
                self.ready.put(None)
            self.stopping.clear()
            self.stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever() and wait for it (call it from another thread)."""
        self.stopping.set()
        self.stopped.wait()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            conn, address = self.socket.accept()
        except OSError:  # the client left before it was accepted
            return
        with self.counting:
            full = self.open_connections >= self.limits.max_connections
            if not full:
                self.open_connections += 1
        if full:
            self._refuse(conn, address)
            return
        self.idle[conn] = (address, time.monotonic() + self.limits.timeout)
        selector.register(conn, selectors.EVENT_READ)

    def _refuse(self, conn: socket.socket, address: Any) -> None:
        """Answer a connection over the cap 503 without waiting on it, and close it."""
        wait = self.retry_after()
        message = (f"the server is busy: it has as many connections open as it takes (--max-connections "
                   f"{self.limits.max_connections}); try again in {wait} s")
        logger.info("%s refused: %s", address[0], message)
        try:
            conn.setblocking(False)
            conn.recv(1 << 16)  # what the client sent already: a close with unread bytes would reset the connection
        except OSError:
            pass
        try:
            conn.send(busy_answer(message, wait))
        except OSError:
            pass
        conn.close()

    def _drop_idle(self, selector: selectors.BaseSelector, now: float) -> None:
        """Close the connections that have sent nothing for `timeout` seconds (all of them when now is inf)."""
        while self.idle:
            conn, (address, until) = next(iter(self.idle.items()))
            if until > now:
                break
            del self.idle[conn]
            selector.unregister(conn)
            logger.debug("%s dropped: sent nothing for %g s", address[0], self.limits.timeout)
            self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self.shutdown_request(conn)
        with self.counting:
            self.open_connections -= 1

    def _work(self) -> None:
        while (item := self.ready.get()) is not None:
            conn, address = item
            try:
                self.finish_request(conn, address)
            except Exception:
                self.handle_error(conn, address)
            finally:
                self._close(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client's broken connection is one log line; anything else is a bug and keeps its traceback."""
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            logger.info("%s: connection lost: %s", client_address[0], one_line(err))
        else:
            logger.exception("%s: the request failed", client_address[0])
