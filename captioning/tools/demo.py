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
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import captioning
from captioning.base.decoding import BEAM_SIZE, MAX_LEN
from captioning.checkpoint import check_checkpoint_file
from captioning.cli import ArgumentParser, positive_int, run_cli
from captioning.inference.demo_app import PROG, make_server
from captioning.inference.demo_page import MB
from captioning.inference.demo_server import ServerLimits

logger = logging.getLogger(__name__)


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
