"""JSON I/O every room shares (data readers, caches, outputs, `captioning-score`): standard library only, beside
files.py, the one file writer it writes through, so that reading a results file never pays for importing torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from captioning.base.files import write_text_atomic

__all__ = ["load_json", "write_json_atomic", "is_id"]


def load_json(path: str | os.PathLike, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Any:
    """Parse a UTF-8 JSON file; a missing, unreadable, non-UTF-8 or invalid file gives one error naming it.

    `object_hook` is json's: called on every object as it is decoded (a reader can shrink entries as they come).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}" if not path.exists() else f"not a file: {path}")
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is accepted
            return json.load(f, object_hook=object_hook)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                         "save it as UTF-8") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err
    except OSError as err:
        raise OSError(f"cannot read {path}: {err.strerror or err}") from err


def write_json_atomic(path: str | os.PathLike, data: Any, indent: int | None = None) -> None:
    """Write JSON (UTF-8) through base/files.py's atomic writer: an interrupted or failed write never leaves half a
    file, and a failure is one OSError line naming the file."""
    text = json.dumps(data, indent=indent) + ("\n" if indent is not None else "")
    write_text_atomic(path, text)


def is_id(value: Any) -> bool:
    """An integer image id (JSON true/false are not ids)."""
    return isinstance(value, int) and not isinstance(value, bool)
