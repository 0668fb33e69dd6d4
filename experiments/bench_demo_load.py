"""Benchmark: `captioning-demo` under load, its server in a child process on 127.0.0.1 (CPU).

For each number of concurrent clients (--clients, default 1 4 16 64), the clients POST generated `shapes` images
(captioning.data.shapes.generate.render_image, 64 px PNGs) to /caption until --requests answers have come back (a new
connection per request: the server closes each after its answer), and the table gives requests per second, the
50th/95th/99th percentile latency of the captions (ms, 200 answers only), the errors (non-200 answers by status,
failed connections by exception) and the server's resident memory (MB, after the row, and its peak so far). Then
the same rows with --idle connections held open that send nothing (each one the server drops after its --timeout
is opened again).

The model is the default config's (`captioning-train` with no arguments: SmallCNN, soft attention, the SAT
decoder) with random weights over a `shapes` vocabulary, unless --checkpoint names a trained one: random weights
rarely emit <end>, so every caption runs to 20 words, the slowest case. The server runs with captioning-demo's
default limits unless --workers, --max-connections, --timeout, --deadline or --queue say otherwise; with the
defaults, 200 idle connections plus 64 clients are over --max-connections 256, so some of those requests are 503s.
The clients use the standard library only (threading, http.client, socket).

    PYTHONPATH=$PWD .venv/bin/python experiments/bench_demo_load.py
    PYTHONPATH=$PWD .venv/bin/python experiments/bench_demo_load.py --clients 1 4 --requests 20 --idle 20  # a check
"""

from __future__ import annotations

import argparse
import collections
import http.client
import io
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir

from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.shapes.generate import build_shapes, render_image
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner, model_config
from captioning.inference.demo_server import ServerLimits
from captioning.runtime import CONF_DIR


def random_checkpoint(folder: Path) -> Path:
    """The default config's captioner with random weights, over the vocabulary of a small generated `shapes` set."""
    data = build_shapes(folder / "shapes", seed=0, num_train=200, num_val=10, num_test=10, image_size=64)
    vocab = Vocabulary.build(c for r in read_karpathy(data, "train") for c in r.captions)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        spec = model_config(compose("train"))
    torch.manual_seed(0)
    return save_checkpoint(folder / "random.pt", build_captioner(spec, len(vocab)), vocab, {"model": spec})


def shapes_uploads(n: int) -> list[bytes]:
    """n random `shapes` images (64 px) as PNG files."""
    rng, out = np.random.default_rng(0), []
    for _ in range(n):
        buffer = io.BytesIO()
        render_image(rng, 64, 1.25)[0].save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


def start_server(checkpoint: Path, limits: list[str], threads: int, log: Path) -> tuple[subprocess.Popen, str, int]:
    """captioning-demo on a free port of 127.0.0.1 in a child process (its log lines to `log`): the process, its
    host and port."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "captioning.tools.demo", "--checkpoint", str(checkpoint),
                                 "--port", "0", "--device", "cpu", *limits], stdout=subprocess.PIPE, stderr=stderr,
                                text=True, env=env)
    assert proc.stdout is not None
    found = re.search(r"on http://([\d.]+):(\d+)/ ", proc.stdout.readline())
    if found is None:
        proc.kill()
        raise SystemExit(f"captioning-demo did not start: {log.read_text().strip()}")
    return proc, found.group(1), int(found.group(2))


def memory_mb(pid: int) -> tuple[float, float]:
    """A process's resident memory now and at its peak (MB), from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def upload(host: str, port: int, body: bytes) -> tuple[str, float]:
    """POST one image to /caption: the status (or the exception's name) and the seconds it took."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("POST", "/caption", body, {"Content-Type": "image/png", "X-Filename": "bench.png"})
        answer = conn.getresponse()
        answer.read()
        outcome = str(answer.status)
    except (OSError, http.client.HTTPException) as err:
        outcome = type(err).__name__
    finally:
        conn.close()
    return outcome, time.perf_counter() - start


def load_row(host: str, port: int, clients: int, requests: int, bodies: list[bytes]) -> dict:
    """`clients` threads upload until `requests` answers are in: requests/s, the captions' latencies (s) and the
    outcomes."""
    todo, lock = iter(range(requests)), threading.Lock()
    latencies: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()

    def client() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            outcome, took = upload(host, port, bodies[i % len(bodies)])
            with lock:
                outcomes[outcome] += 1
                if outcome == "200":  # a quick 503 is counted as an error, not as a latency
                    latencies.append(took)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"rate": requests / (time.perf_counter() - start), "latencies": sorted(latencies), "outcomes": outcomes}


class IdleConnections:
    """`n` connections to the server that send nothing; one the server closes is opened again."""

    def __init__(self, host: str, port: int, n: int):
        self.address, self.n, self.reopened, self.stop = (host, port), n, 0, threading.Event()
        self.socks = [socket.create_connection(self.address) for _ in range(n)]
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    def _keep(self) -> None:
        while not self.stop.is_set():
            closed, _, _ = select.select(self.socks, [], [], 0.2)
            for sock in closed:  # closed by the server after its --timeout (or answered 503): open another
                sock.close()
                self.socks.remove(sock)
                self.socks.append(socket.create_connection(self.address))
                self.reopened += 1
            if closed:  # refused ones are tried again 0.2 s later, not in a tight loop
                self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.socks:
            sock.close()


def percentile(values: list[float], q: float) -> str:
    """The q-th percentile of sorted seconds (nearest rank), in ms; "-" for none."""
    return f"{1000 * values[min(len(values) - 1, max(0, round(q / 100 * len(values)) - 1))]:.0f}" if values else "-"


def print_rows(host: str, port: int, pid: int, args: argparse.Namespace, bodies: list[bytes]) -> None:
    print("| clients | requests/s | p50 ms | p95 ms | p99 ms (of the 200s) | errors | server RSS MB (peak) |")
    print("|---|---|---|---|---|---|---|")
    for clients in args.clients:
        row = load_row(host, port, clients, args.requests, bodies)
        lat, errors = row["latencies"], {k: v for k, v in row["outcomes"].items() if k != "200"}
        rss, peak = memory_mb(pid)
        print(f"| {clients} | {row['rate']:.1f} | {percentile(lat, 50)} | {percentile(lat, 95)} | "
              f"{percentile(lat, 99)} | {', '.join(f'{k}: {v}' for k, v in sorted(errors.items())) or 0} | "
              f"{rss:.0f} ({peak:.0f}) |", flush=True)


def main() -> None:
    default = ServerLimits()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, help="a trained checkpoint (default: random weights, see above)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64], help="concurrent clients, one row each")
    p.add_argument("--requests", type=int, default=400, help="answers per row")
    p.add_argument("--idle", type=int, default=200, help="idle connections held open in the second table")
    p.add_argument("--images", type=int, default=16, help="distinct generated images the clients upload")
    p.add_argument("--threads", type=int, default=2, help="the server's torch threads (OMP_NUM_THREADS)")
    for name, value in (("workers", default.workers), ("max-connections", default.max_connections),
                        ("timeout", default.timeout), ("deadline", default.deadline), ("queue", default.queue)):
        p.add_argument(f"--{name}", default=str(value), help=f"the server's --{name} (default {value})")
    args = p.parse_args()
    limits = [f"--{name}={getattr(args, name.replace('-', '_'))}"
              for name in ("workers", "max-connections", "timeout", "deadline", "queue")]
    bodies = shapes_uploads(args.images)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or random_checkpoint(Path(tmp))
        model = args.checkpoint or "the default config's model with random weights (captions of 20 words)"
        print(f"captioning-demo {' '.join(limits)}, torch threads {args.threads}; model: {model}; "
              f"{args.requests} requests per row, {len(bodies)} distinct 64 px PNGs", flush=True)
        proc, host, port = start_server(checkpoint, limits, args.threads, Path(tmp) / "demo.log")
        try:
            upload(host, port, bodies[0])  # warm-up: the first decode allocates
            print_rows(host, port, proc.pid, args, bodies)
            print(f"\nwith {args.idle} idle connections held open:", flush=True)
            idle = IdleConnections(host, port, args.idle)
            try:
                print_rows(host, port, proc.pid, args, bodies)
            finally:
                idle.close()
            print(f"(idle connections opened again after the server closed them: {idle.reopened})")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
