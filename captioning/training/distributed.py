"""Multi-process training with PyTorch's own engine: the helpers a `torchrun` launch needs.

    torchrun --standalone --nproc_per_node=N -m captioning.train [overrides] [hydra.run.dir=outputs/ddp]

starts N processes and gives each RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_from_env`
joins the process group they describe. dataset.batch_size is per process: the global batch is N times it.
`torchrun_overrides` makes the N Hydra apps of a launch one run (one run folder, written by rank 0).
Every helper also works in a plain single process (no torchrun): the world then has one rank, collectives
return their input unchanged and nothing is initialised, so single-process code paths stay as they were.

Backend: gloo on a CPU-only machine; with CUDA, "cpu:gloo,cuda:nccl": gradients (CUDA tensors) go
through NCCL, and the small Python objects exchanged here (scores, predictions) through gloo on the CPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a torchrun launch."""

    rank: int  # 0 .. world_size - 1 over all nodes
    world_size: int
    local_rank: int  # index on this node: the GPU it uses


def env_from_os() -> DistEnv | None:
    """The launch torchrun describes in the environment, or None when not launched by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        env = DistEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError as err:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers (as torchrun sets them): {err}") from err
    if env.world_size < 1 or not 0 <= env.rank < env.world_size or env.local_rank < 0:
        raise ValueError(f"inconsistent torchrun environment: RANK={env.rank}, WORLD_SIZE={env.world_size}, "
                         f"LOCAL_RANK={env.local_rank}")
    return env


def initialized() -> bool:
    """Whether this process is part of a process group (a torchrun launch)."""
    return dist.is_available() and dist.is_initialized()


def gpu_index(env: DistEnv) -> int:
    """This process's GPU under torchrun: cuda:LOCAL_RANK, with a clear error when there are fewer GPUs than
    processes on the node."""
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise RuntimeError(f"torchrun started process LOCAL_RANK={env.local_rank}, but only {count} GPU(s) are "
                           "visible; use --nproc_per_node <= the number of GPUs (or CUDA_VISIBLE_DEVICES)")
    return env.local_rank


def init_from_env() -> DistEnv | None:
    """Join the process group torchrun describes (once; later calls only return it); None without torchrun."""
    env = env_from_os()
    if env is None or initialized():
        return env
    if not dist.is_available():
        raise RuntimeError("launched by torchrun, but this PyTorch build has no torch.distributed support")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(gpu_index(env))
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size)
    return env


def cleanup() -> None:
    """Leave the process group (a no-op when not in one)."""
    if initialized():
        dist.destroy_process_group()


def exit_process(status: int) -> NoReturn:
    """End a torchrun worker after cleanup() with exit `status` (cli.exit_status gives a SystemExit's): Python's
    exit handlers run (logging's flush and close among them) and stdout/stderr are flushed, then the process
    leaves with os._exit, skipping the C++ teardown that follows. That teardown aborts now and then after a finished
    run, with nothing of Python left to run ("terminate called without an active exception", SIGABRT; 2 in about
    100 two-rank CPU runs under load here, torch 2.14.1), and torchrun then reports the whole launch as failed."""
    import atexit
    import sys

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or a broken pipe: nothing more can be said
                pass
        os._exit(status)


def rank() -> int:
    """This process's rank (0 without torchrun)."""
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    """Number of processes (1 without torchrun)."""
    return dist.get_world_size() if initialized() else 1


def is_main() -> bool:
    """Rank 0: the one process that writes files and logs."""
    return rank() == 0


def local_device(device: torch.device) -> torch.device:
    """Under torchrun a CUDA device becomes this process's GPU, cuda:LOCAL_RANK; other devices are kept."""
    env = env_from_os()
    if not initialized() or env is None or device.type != "cuda":
        return device
    if device.index is not None and device.index != env.local_rank:
        raise ValueError(f"device={device} was requested, but under torchrun each process uses cuda:LOCAL_RANK "
                         f"(here cuda:{env.local_rank}); pass device=cuda or device=auto and choose GPUs with "
                         "CUDA_VISIBLE_DEVICES")
    torch.cuda.set_device(gpu_index(env))
    return torch.device("cuda", env.local_rank)


def wrap(module: torch.nn.Module, device: torch.device, find_unused_parameters: bool) -> torch.nn.Module:
    """`module` in DistributedDataParallel under torchrun (it averages gradients over the ranks during backward),
    itself in a plain process."""
    if not initialized():
        return module
    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=find_unused_parameters)


def torchrun_overrides(args: list[str], train_yaml: Path) -> list[str]:
    """Hydra overrides that make the N processes of a torchrun launch one run: all ranks use rank 0's run folder
    (`train_yaml`'s hydra.run.dir stamped with rank 0's clock, unless hydra.run.dir is given), and ranks
    other than 0 write no Hydra files (no .hydra/ folder, no log file). A collective: every rank calls it."""
    if any(a in ("-m", "--multirun") for a in args):
        raise SystemExit("captioning-train: under torchrun the N processes train one run; launch sweeps without "
                         "torchrun (e.g. hydra/launcher=submitit_slurm gives each run its own GPUs)")
    given = {a.split("=", 1)[0].lstrip("+~") for a in args if "=" in a}
    extra = []
    if "hydra.run.dir" not in given:
        pattern = str(OmegaConf.to_container(OmegaConf.load(train_yaml), resolve=False)["hydra"]["run"]["dir"])  # type: ignore[index,call-overload]
        now = datetime.now()
        run_dir = re.sub(r"\$\{now:([^}]*)\}", lambda m: now.strftime(m.group(1)), pattern)
        extra.append(f"hydra.run.dir={broadcast_object(run_dir)}")
    if not is_main():
        extra += [o for o in ("hydra.output_subdir=null", "hydra/job_logging=stdout") if o.split("=")[0] not in given]
    return extra


def barrier() -> None:
    """Wait until every rank gets here."""
    if initialized():
        dist.barrier()


@contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. generating a data set), the others after it finished."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank `src`'s `obj` on every rank (pickled; for small things such as scores and decisions)."""
    if not initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not initialized():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_objects(obj: T, dst: int = 0) -> list[T] | None:
    """Every rank's `obj`, in rank order, on rank `dst` (None on the others)."""
    if not initialized():
        return [obj]
    out: list[Any] | None = [None] * world_size() if rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def any_rank(flag: bool) -> bool:
    """True on every rank if `flag` is true on any: decisions that must be taken by all ranks together."""
    if not initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def pooled_means(sums: dict[str, float], count: int) -> dict[str, float]:
    """Every rank's `sums` added up and divided by the ranks' total `count`: means over all ranks' steps
    (a collective; in one process simply sums / count). With equal per-rank batches the pooled loss is the
    loss of the global batch; token_nll, a per-rank token mean, is pooled as a mean of those means."""
    parts = all_gather_objects((sums, count))
    total = sum(c for _, c in parts)
    keys = dict.fromkeys(k for s, _ in parts for k in s)
    return {k: sum(s.get(k, 0.0) for s, _ in parts) / max(total, 1) for k in keys}
