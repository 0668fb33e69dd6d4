"""What a captioning run over many images writes: a JSON Lines log (one line per captioned image, appended batch by
batch, the record a run is continued from) and a COCO results file (what `captioning-score` and `captioning-html`
read).

The log `X.jsonl` has a settings file beside it (`X.jsonl.settings.json`: checkpoint and its SHA-256, beam size,
max_len, length penalty), so `--resume` refuses to continue a log made with other settings rather than mixing two
runs' captions in one file. A line cut short by a kill (the last one, without its newline) is dropped on resume,
and its image captioned again. An append that fails (a full disk) is cut back off the log, which keeps every earlier
line whole, and stops the run with one line `cannot write X.jsonl: REASON`: `--resume` then goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from captioning.base.files import append_bytes, write_bytes_atomic
from captioning.base.jsonio import load_json, write_json_atomic

SETTINGS_SUFFIX = ".settings.json"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class CaptionLog:
    """The JSON Lines record of a run: `done` holds the rows already written (by image key), `append` adds rows."""

    def __init__(self, path: str | os.PathLike, settings: Mapping[str, Any], resume: bool = False):
        self.path = Path(path)
        self.settings_path = self.path.with_name(self.path.name + SETTINGS_SUFFIX)
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.exists() and not resume:
            raise FileExistsError(f"{self.path} exists: pass --resume to continue that run, or remove the file")
        if resume and self.path.exists():
            self._check_settings(dict(settings))
            self._read()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(self.path, b"")
            write_json_atomic(self.settings_path, dict(settings), indent=1)

    def _check_settings(self, settings: dict[str, Any]) -> None:
        if not self.settings_path.is_file():
            raise ValueError(f"cannot resume {self.path}: its settings file {self.settings_path} is missing")
        before = load_json(self.settings_path)
        if not isinstance(before, dict):
            raise ValueError(f"cannot resume {self.path}: {self.settings_path} is not a settings object")
        differ = [k for k in sorted(set(before) | set(settings)) if before.get(k) != settings.get(k)]
        if differ:
            changes = ", ".join(f"{k}: {before.get(k)!r} then, {settings.get(k)!r} now" for k in differ)
            raise ValueError(f"cannot resume {self.path} with other settings ({changes}); use a new --jsonl file")

    def _read(self) -> None:
        """Rows of an earlier run; an unfinished last line is cut off (the file is truncated to the last full one)."""
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1  # everything after the last newline is a line cut short
        for n, line in enumerate(data[:good].decode("utf-8").splitlines(), 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{self.path}: line {n} is not JSON ({err.msg}); it is not a caption log") from err
            if not isinstance(row, dict) or not isinstance(row.get("path"), str):
                raise ValueError(f"{self.path}: line {n} has no 'path'; it is not a caption log")
            self.done[row["path"]] = row
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        """Write rows (one JSON object a line) and force them to the disk, so a kill loses at most this batch; a failed
        write leaves the log as it was before the call (see the module docstring)."""
        rows = list(rows)
        append_bytes(self.path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8"))
        self.done.update((row["path"], row) for row in rows)


def write_results(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> int:
    """A COCO results file [{"image_id", "caption"}] (sorted by id) from rows with an image id; returns its length."""
    results = sorted(({"image_id": r["image_id"], "caption": r["caption"]} for r in rows
                      if r.get("image_id") is not None), key=lambda r: r["image_id"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, results)
    return len(results)
