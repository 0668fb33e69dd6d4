"""What a run logs to TensorBoard: rank 0 writes <run>/tensorboard; the other ranks of a torchrun launch get a
`NullWriter`, which writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.training import distributed

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


def open_writer(out_dir: Path) -> SummaryWriter | NullWriter:
    """The run's TensorBoard writer on rank 0 (or the only process), a NullWriter on the other ranks."""
    from torch.utils.tensorboard import SummaryWriter  # imported when a run starts, not with the package

    return SummaryWriter(str(out_dir / "tensorboard")) if distributed.is_main() else NullWriter()


class NullWriter:
    """Stands in for the TensorBoard writer on ranks other than 0, which write no files: every call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def __enter__(self) -> NullWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
