"""Caption your own images in a browser: `captioning-demo --checkpoint best.pt [--port 8000] [--host 127.0.0.1]`.

Serves one local page (captioning/inference/demo_page.py) where an image is chosen or dropped; the page POSTs its
bytes to /caption and shows the caption, the beam's alternatives with their log-probabilities, and each word's
attention map on hover. Bound to 127.0.0.1 unless --host says otherwise (`--port 0` picks a free port; the URL is
printed).

An upload is checked before it is decoded: no Content-Length is a 411, one over --max-upload-mb a 413, and the
bytes are read by the project's one image loader (captioning/data/images.py: decompression-bomb guard, corrupt or
truncated files) through a temporary file deleted afterwards; a file it refuses is a 400 whose one-line JSON
`error` the page shows. One upload decodes at a time (a lock around the model). Each request is one log line.
A bad checkpoint or option is one `error:` line and exit status 2 before anything is served; Ctrl-C stops the
server (exit status 0).

With --host the page can be shared on a network, so the server (captioning/inference/demo_server.py) is bounded:
  --workers N          threads that handle requests (default 24); an idle connection holds none of them
  --max-connections N  open connections at most (default 256); one more is answered 503 at once and closed
  --timeout S          seconds a connection may send nothing, before its request or within it (default 30)
  --deadline S         seconds to receive one whole request (default 60): a client trickling bytes is dropped
  --queue N            uploads that may wait while the model decodes another (default 16); one more is a 503
Every 503 has a JSON `error` and Retry-After (the recent decoding time x (--queue + 1) seconds); upload bodies in
memory stay under --workers x --max-upload-mb. --workers must be at least --queue + 2: each upload in the model's
line holds a worker, and one more must stay free to answer the page and the 503s.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from PIL import Image

import captioning
from captioning.base.decoding import BEAM_SIZE, MAX_LEN
from captioning.checkpoint import check_checkpoint_file
from captioning.cli import ArgumentParser, one_line, positive_int, run_cli
from captioning.data.images import ImageError, load_image
from captioning.inference.demo_page import MB, render_demo_page, result_payload, too_large_message
from captioning.inference.demo_server import BoundedHandler, BoundedHTTPServer, ServerLimits

if TYPE_CHECKING:  # the model's module imports torch: loaded by captioning.load when serving, not for --help
    from captioning.inference.model import CaptionModel

PROG = "captioning-demo"
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


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: a free one)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0: a free port), got {text!r}")
    return int(text)


def count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def serve(args: argparse.Namespace, limits: ServerLimits) -> int:
    """Load the model, bind the server, print its URL and serve until Ctrl-C; returns 0."""
    check_checkpoint_file(args.checkpoint)  # a missing or foreign file is refused before torch loads
    model = captioning.load(args.checkpoint, args.device)
    server = make_server(model, args.host, args.port, args.beam_size, args.alternatives, args.max_len,
                         args.max_upload_mb * MB, limits)
    print(f"{PROG}: serving {args.checkpoint} on {server.url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print(f"{PROG}: stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 once stopped by Ctrl-C)."""
    parser = ArgumentParser(prog=PROG, description="Serve a local page that captions an uploaded image and shows "
                            "the beam's alternatives and each word's attention map.",
                            epilog="example: captioning-demo --checkpoint outputs/<run>/checkpoints/best.pt "
                            "--port 0")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=port_number, default=8000, help="0: a free port (the URL is printed)")
    parser.add_argument("--beam-size", type=positive_int, default=BEAM_SIZE)
    parser.add_argument("--alternatives", type=count, default=3, help="captions of the beam to list (>= 0)")
    parser.add_argument("--max-len", type=positive_int, default=MAX_LEN, help="most words per caption (>= 1)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-upload-mb", type=positive_int, default=20, help="largest image file accepted")
    bounds = parser.add_argument_group("limits", "what one client or a burst may hold, for a page shared with --host")
    default = ServerLimits()
    bounds.add_argument("--workers", type=positive_int, default=default.workers,
                        help=f"threads that handle requests (default {default.workers}; >= --queue + 2)")
    bounds.add_argument("--max-connections", type=positive_int, default=default.max_connections,
                        help=f"open connections at most; more are answered 503 (default {default.max_connections})")
    bounds.add_argument("--timeout", type=seconds, default=default.timeout,
                        help=f"seconds a connection may send nothing (default {default.timeout:g})")
    bounds.add_argument("--deadline", type=seconds, default=default.deadline,
                        help=f"seconds to receive one whole request (default {default.deadline:g})")
    bounds.add_argument("--queue", type=count, default=default.queue,
                        help=f"uploads that may wait for the model; more are answered 503 (default {default.queue})")
    args = parser.parse_args(argv)
    try:
        limits = ServerLimits(args.workers, args.max_connections, args.timeout, args.deadline, args.queue)
    except ValueError as err:
        parser.error(str(err))
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    return run_cli(lambda: serve(args, limits), PROG, (ValueError, OSError, RuntimeError))


def cli() -> None:
    """Console script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
