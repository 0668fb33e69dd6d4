"""The one checkpoint format: a plain dict of state_dicts, the resolved config and the vocabulary.

Written through base/files.py's atomic writer (tmp file, fsync, rename), so an interrupted or failed save (a full
disk) never leaves a broken file: the previous last.pt stays whole and the run stays resumable. A
checkpoint is data, never code: it is read with `weights_only=True` (no pickled objects). Rebuilding a model
from one (its config checked against the registry first) is `captioning.factory.load.load_model`.

torch is imported by the functions that need it: `check_checkpoint_file` refuses a missing file, one that is not
the zip archive torch.save writes, or another tool's (its pickled structure never names FORMAT), before a command
has loaded torch and the models.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.base.files import atomic_file
from captioning.data.tokenizers import CAPTION_TOKENIZERS, DEFAULT_TOKENIZER
from captioning.data.vocab import Vocabulary

if TYPE_CHECKING:
    import torch

    from captioning.models.captioner import Captioner

FORMAT = "captioning/v1"
Upgrade = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (stored, run) -> stored as this code reads it
MAX_STRUCTURE_BYTES = 64 << 20  # a checkpoint's pickled structure (no tensors) is far smaller; a larger one: torch.load


def save_checkpoint(path: str | os.PathLike, model: Captioner, vocab: Vocabulary, config: dict[str, Any],
                    **extra: Any) -> Path:
    """Write model weights, config (plain containers), vocabulary and `extra` (optimizer state, epoch...).

    A failed write raises an OSError `cannot write PATH: REASON` and leaves the file at `path` as it was."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "model": model.state_dict(), "config": config, "vocab": vocab.to_list(), **extra}
    with atomic_file(path) as f:
        torch.save(payload, f)
    return path


def _reason(err: Exception) -> str:
    """Why torch.load refused a file, short (torch's weights-only message runs to several paragraphs)."""
    if isinstance(err, pickle.UnpicklingError):
        return ("not a file torch.save wrote, or one holding objects other than tensors and plain containers, "
                "which are refused for safety")
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first[:200]}" if first else type(err).__name__


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """Refuse, without torch, a file that cannot be a checkpoint: FileNotFoundError for a missing one, ValueError
    for one that is not a zip archive (torch.save has written only those since PyTorch 1.6; mmap needs them) or
    whose pickled structure (the archive's data.pkl: the dict, tensors stored apart) never names FORMAT, as a
    torch.save file of another tool. What passes is checked in full by read_checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            structure = [i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"]
            if len(structure) == 1 and structure[0].file_size <= MAX_STRUCTURE_BYTES:
                names_format = FORMAT.encode() in archive.read(structure[0])
            else:
                names_format = True  # unusual: left to torch.load
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a readable captioning checkpoint (not a file torch.save wrote)") from None
    except (OSError, RuntimeError, ValueError) as err:  # unreadable, or a zip member torch never writes
        raise ValueError(f"{path} is not a readable captioning checkpoint ({_reason(err)})") from err
    if not names_format:
        raise ValueError(f"{path} is not a captioning checkpoint (expected format {FORMAT!r}); "
                         "was it written by another tool?")
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint dict safely, with a clear error for a missing or foreign file (`mmap`: tensors mapped
    from the file, not read, for a look at its config)."""
    import torch

    path = check_checkpoint_file(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # unpickling errors come in many types; all mean "not ours"
        raise ValueError(f"{path} is not a readable captioning checkpoint ({_reason(err)})") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{path} is not a captioning checkpoint (expected format {FORMAT!r}); "
                         "was it written by another tool?")
    return ckpt


def same_model(ckpt: dict[str, Any], path: str | os.PathLike, model_config: dict[str, Any],
               vocab: Vocabulary | None, action: str, advice: str, upgrade: Upgrade | None = None) -> None:
    """Refuse (one ValueError) a checkpoint whose stored model config, or vocabulary (unless None), is not the run's:
    what resume and init_from load into the run's own model. `upgrade(stored, run)`: the stored model config as
    this code reads it (factory/registry.py `with_added_defaults`: arguments added since, at their defaults)."""
    config = ckpt.get("config")
    stored = config.get("model") if isinstance(config, dict) else None
    if upgrade is not None and isinstance(stored, dict):
        stored = upgrade(stored, model_config)
    same = stored is not None and stored == model_config
    if not same or (vocab is not None and checkpoint_vocabulary(ckpt, path) != vocab):
        raise ValueError(f"cannot {action} {path}: it was trained with a different model config or vocabulary; "
                         f"{advice}")


def load_same_model(path: str | os.PathLike, model: Captioner, vocab: Vocabulary, model_config: dict[str, Any],
                    map_location: str | torch.device, action: str, advice: str,
                    upgrade: Upgrade | None = None) -> dict[str, Any]:
    """Read a checkpoint of this model config and vocabulary, check its weights' shapes and load them into `model`
    (resume, init_from); returns the checkpoint. Any other is refused in one line."""
    ckpt = read_checkpoint(path, map_location)
    same_model(ckpt, path, model_config, vocab, action, advice, upgrade)
    check_weights(model.state_dict(), ckpt.get("model"), len(vocab), path)
    model.load_state_dict(ckpt["model"])
    return ckpt


def checkpoint_vocabulary(ckpt: dict[str, Any], path: str | os.PathLike) -> Vocabulary:
    """The checkpoint's vocabulary: a list of distinct strings starting with the special tokens, with the tokenizer
    its words were made by (the stored dataset.tokenizer; ptb where the config names none, as before the choice)."""
    words = ckpt.get("vocab")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ValueError(f"checkpoint {path}: its vocabulary is not a list of words")
    config = ckpt.get("config")
    dataset = config.get("dataset") if isinstance(config, dict) else None
    tokenizer = dataset.get("tokenizer", DEFAULT_TOKENIZER) if isinstance(dataset, dict) else DEFAULT_TOKENIZER
    if tokenizer not in CAPTION_TOKENIZERS:
        raise ValueError(f"checkpoint {path}: dataset.tokenizer={tokenizer!r} names no tokenizer of "
                         f"{', '.join(CAPTION_TOKENIZERS)}")
    try:
        return Vocabulary(words, tokenizer)
    except ValueError as err:
        raise ValueError(f"checkpoint {path}: {err}") from None


def check_weights(expected: Mapping[str, torch.Tensor], stored: Any, vocab_size: int,
                  path: str | os.PathLike) -> None:
    """Refuse stored weights that are not a state_dict of tensors or whose keys, shapes or dtypes differ from the
    model's (`expected`: its state_dict, e.g. on the meta device), with one line naming the first difference; a
    size that differs where the model has the vocabulary's size is named as the vocabulary's; a NaN or infinite
    value is refused too. Nothing is allocated: a config asking for more than its weights hold is refused before a
    model is built."""
    import torch

    if not isinstance(stored, dict) or not all(isinstance(v, torch.Tensor) for v in stored.values()):
        raise ValueError(f"checkpoint {path}: its 'model' entry is not a state_dict of tensors")
    missing = [k for k in expected if k not in stored]
    unexpected = [k for k in stored if k not in expected]
    if missing or unexpected:
        what = (f"no weights for {missing[0]!r} ({len(missing)} missing)" if missing
                else f"weights for {unexpected[0]!r}, which its model does not have ({len(unexpected)} extra)")
        raise ValueError(f"checkpoint {path}: its config describes another model than its weights: {what}")
    for key, want in expected.items():
        have = stored[key]
        if have.shape != want.shape:
            vocab_dims = [d for d, n in enumerate(want.shape) if n == vocab_size and have.dim() == want.dim()
                          and have.shape[d] != n]
            if vocab_dims and all(have.shape[d] == want.shape[d] for d in range(want.dim()) if d not in vocab_dims):
                raise ValueError(f"checkpoint {path}: its vocabulary has {vocab_size} words but its weights are "
                                 f"for {have.shape[vocab_dims[0]]} ({key} is {tuple(have.shape)})")
            raise ValueError(f"checkpoint {path}: its config describes another model than its weights: {key} is "
                             f"{tuple(want.shape)} in the model and {tuple(have.shape)} in the file")
        if have.dtype != want.dtype:
            raise ValueError(f"checkpoint {path}: {key} is stored as {have.dtype}, the model has {want.dtype}")
    for key, have in stored.items():  # NaN weights caption nothing: refused, not scored 0 in silence
        if have.is_floating_point() and not bool(torch.isfinite(have).all()):
            bad = int((~torch.isfinite(have)).sum())
            raise ValueError(f"checkpoint {path}: its weights are not finite ({key}: {bad} of {have.numel()} values "
                             "are NaN or infinite); it cannot caption: use a checkpoint of a run that did not diverge")
