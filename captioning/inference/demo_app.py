"""The demo's HTTP application (`captioning-demo`, captioning/tools/demo.py): GET / is the page (demo_page.py),
POST /caption captions the uploaded bytes with the model, one upload at a time, the others waiting in a bounded line
(a full line is a 503 with Retry-After). An upload is checked before it is decoded (its length, then the one image
loader) and every refusal is a one-line JSON `error`; each request is one log line. It runs on the bounded server of
demo_server.py.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import tempfile
import threading
import time
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from PIL import Image

from captioning.base.decoding import BEAM_SIZE, MAX_LEN
from captioning.base.messages import one_line
from captioning.data.images import ImageError, load_image
from captioning.inference.demo_page import MB, render_demo_page, result_payload, too_large_message
from captioning.inference.demo_server import BoundedHandler, BoundedHTTPServer, ServerLimits

if TYPE_CHECKING:  # the model's module imports torch: loaded by captioning.load when serving, not for --help
    from captioning.inference.model import CaptionModel

PROG = "captioning-demo"  # the command it serves under: its log lines and the Server header
DRAIN_MAX = 64 * MB  # an over-limit body up to this size is read and dropped, so the browser sees the 413, not a reset
logger = logging.getLogger(__name__)


def upload_name(header: str | None) -> str:
    """A printable file name for messages, from the page's X-Filename header (URL-encoded); "upload" if none."""
    name = unquote(header or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if c.isprintable())[:100].strip()
    return name or "upload"


def read_upload(data: bytes, name: str) -> Image.Image:
    """Uploaded bytes as an RGB image, read by the one image loader from a temporary file (deleted afterwards);
    an ImageError naming the upload (not the temporary file) otherwise."""
    with tempfile.TemporaryDirectory(prefix="captioning-demo-") as folder:
        path = Path(folder) / "upload"
        path.write_bytes(data)
        try:
            return load_image(path)
        except ImageError as err:
            raise ImageError(one_line(err).replace(str(path), name)) from None


class Busy(Exception):
    """The model's line is full: the upload is answered 503."""


class DemoServer(BoundedHTTPServer):
    """The demo's HTTP server: the model, its decoding options, the page, the lock that serialises decoding and the
    slots of the uploads in the model's line (the one decoding and those waiting)."""

    def __init__(self, model: CaptionModel, host: str = "127.0.0.1", port: int = 0, beam_size: int = BEAM_SIZE,
                 alternatives: int = 3, max_len: int = MAX_LEN, max_upload_bytes: int = 20 * MB,
                 limits: ServerLimits | None = None):
        self.model, self.beam_size, self.alternatives, self.max_len = model, beam_size, alternatives, max_len
        self.max_upload_bytes = max_upload_bytes
        limits = limits or ServerLimits()
        self.decoding = threading.Lock()  # one upload decodes at a time
        self.slots = threading.BoundedSemaphore(limits.queue + 1)  # the upload decoding and those waiting for it
        self.decode_seconds = 0.0  # a moving average, for Retry-After
        self.page = render_demo_page(max_upload_bytes, beam_size, alternatives, max_len).encode("utf-8")
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            super().__init__((host, port), DemoHandler, limits)
        except OSError as err:
            raise OSError(f"cannot serve on {host}:{port}: {err.strerror or err} "
                          "(try another --port, or --port 0)") from err

    @property
    def url(self) -> str:
        """The page's address."""
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the recent decoding time times the uploads the line holds."""
        return max(1, math.ceil(self.decode_seconds * (self.limits.queue + 1)))

    def caption(self, data: bytes, name: str) -> dict[str, Any]:
        """The JSON answer for uploaded bytes; ImageError for a file that is not a usable image, Busy when the
        model's line is full."""
        if not self.slots.acquire(blocking=False):
            raise Busy(f"the server is busy: every place in the model's queue is taken (--queue {self.limits.queue}); "
                       f"try again in {self.retry_after()} s")
        try:
            image = read_upload(data, name)
            with self.decoding:
                start = time.monotonic()
                result = self.model.caption_batch([image], [name], self.beam_size, self.max_len,
                                                  self.alternatives)[0]
                took = time.monotonic() - start
                self.decode_seconds = took if not self.decode_seconds else 0.8 * self.decode_seconds + 0.2 * took
        finally:
            self.slots.release()
        return result_payload(result)


def make_server(model: CaptionModel, host: str = "127.0.0.1", port: int = 0, beam_size: int = BEAM_SIZE,
                alternatives: int = 3, max_len: int = MAX_LEN, max_upload_bytes: int = 20 * MB,
                limits: ServerLimits | None = None) -> DemoServer:
    """The demo server bound to host:port (0: a free port), not yet serving: call `serve_forever()` (in a thread
    for tests, then `shutdown()` and `server_close()`)."""
    return DemoServer(model, host, port, beam_size, alternatives, max_len, max_upload_bytes, limits)


class DemoHandler(BoundedHandler):
    """GET / is the page, POST /caption captions the request body; every answer but the page is JSON. The request
    is read with the server's --timeout and --deadline (BoundedHandler)."""

    server: DemoServer
    server_version = "captioning-demo"

    def handle_one_request(self) -> None:
        self.started, self.status, self.note, self.sent = time.monotonic(), 0, "", 0
        super().handle_one_request()
        if self.status or self.note:  # one line per request (a connection that sent nothing is not one)
            took = time.monotonic() - self.started
            logger.info('%s "%s" %s %d bytes %.2f s%s', self.address_string(), getattr(self, "requestline", ""),
                        self.status or "-", self.sent, took, f" ({self.note})" if self.note else "")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.status = int(code) if str(code).isdigit() else 0

    def log_error(self, format: str, *args: Any) -> None:
        self.note = format % args  # the base class's own errors (bad request line, unknown method, time-out)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                self.send_header("Retry-After", str(self.server.retry_after()))
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
            self.sent = len(body)
        except ConnectionError as err:  # the client left before its answer
            self.note = f"{self.note}; client gone: {err}" if self.note else f"client gone: {err}"

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        if "error" in payload:
            self.note = payload["error"]
        self._send(status, json.dumps(payload, separators=(",", ":")).encode("utf-8"), "application/json")

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {path} (the demo is at /)"})

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/caption":
            self._json(HTTPStatus.NOT_FOUND, {"error": "POST the image to /caption"})
            return
        try:
            status, payload = self._caption()
        except Exception as err:  # a bug: answered and logged, and the server goes on serving
            logger.exception("%s: %s failed", PROG, self.requestline)
            status, payload = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {one_line(err)}"}
        self._json(status, payload)

    def _caption(self) -> tuple[int, dict[str, Any]]:
        name, length = upload_name(self.headers.get("X-Filename")), self.headers.get("Content-Length")
        limit = self.server.max_upload_bytes
        if length is None:
            return HTTPStatus.LENGTH_REQUIRED, {"error": "the upload has no Content-Length: send the image file as "
                                                "the request body with its length"}
        if not length.strip().isdigit():
            return HTTPStatus.BAD_REQUEST, {"error": f"bad Content-Length {length!r}: expected a number of bytes"}
        size = int(length)
        if size > limit:
            self._discard(size)
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": too_large_message(size, limit)}
        if size == 0:
            return HTTPStatus.BAD_REQUEST, {"error": "the upload is empty: choose an image file"}
        try:
            data = self.rfile.read(size)
        except OSError as err:  # the time-out of a client that stopped sending, or sends too slowly
            return HTTPStatus.BAD_REQUEST, {"error": f"the upload stopped before its end: {one_line(err)}"}
        if len(data) < size:
            return HTTPStatus.BAD_REQUEST, {"error": f"the upload stopped after {len(data)} of {size} bytes"}
        try:
            payload = self.server.caption(data, name)
        except Busy as err:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(err)}
        except ImageError as err:
            return HTTPStatus.BAD_REQUEST, {"error": one_line(err)}
        except RuntimeError as err:  # e.g. an image smaller than the encoder's pooling (SmallCNN without image_size)
            return HTTPStatus.BAD_REQUEST, {"error": f"cannot caption {name}: {one_line(err)}"}
        self.note = f"{name}: {payload['caption']!r}"
        return HTTPStatus.OK, payload

    def _discard(self, size: int) -> None:
        """Read and drop a refused body (up to DRAIN_MAX), so the client can read the answer before the close."""
        self.close_connection = True
        left = size if size <= DRAIN_MAX else 0
        try:
            while left > 0 and (chunk := self.rfile.read(min(left, MB))):
                left -= len(chunk)
        except OSError:
            pass
