"""The rows of a plain table file (CSV with a header row, or JSON Lines): what the table reader and split files read.

A missing or non-UTF-8 file, a header without a required column or naming one twice, a row longer than the header,
a line that is not a JSON object: each a ValueError naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from captioning.data.readers.records import describe

SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
COLUMNS = ("image", "caption", "split", "image_id")
REQUIRED = ("image", "caption")


def read_text(path: Path) -> str:
    """The file's text (UTF-8, an optional byte-order mark); a missing or non-UTF-8 file gives an error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}" if not path.exists() else f"not a file: {path}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise OSError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text (byte {err.start}: "
                         f"{data[err.start:err.start + 1]!r}); save the table as UTF-8") from err


def csv_rows(text: str, path: Path, columns: Sequence[str] = COLUMNS,
              required: Sequence[str] = REQUIRED) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, {column: cell}) of each non-blank CSV row; empty optional cells are left out."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [name.strip().lower() for name in next(reader, [])]
        for name in required:
            if name not in header:
                optional = [c for c in columns if c not in required]
                raise ValueError(f"{path}: line 1: the header lacks the '{name}' column (it has {header}); a table "
                                 f"needs the columns {' and '.join(required)}"
                                 + (f", optionally {' and '.join(optional)}" if optional else ""))
        for name in columns:
            if header.count(name) > 1:
                raise ValueError(f"{path}: line 1: the header names the '{name}' column twice")
        start = reader.line_num + 1
        for row in reader:
            line, start = start, reader.line_num + 1
            if not any(cell.strip() for cell in row):
                continue
            if len(row) > len(header):
                raise ValueError(f"{path}: line {line}: the row has {len(row)} fields, the header {len(header)} "
                                 f"(quote a caption that holds a comma)")
            cells = dict(zip(header, row))
            yield line, {k: v for k, v in cells.items() if k in columns and (k in required or v.strip())}
    except csv.Error as err:
        raise ValueError(f"{path}: line {reader.line_num}: not valid CSV ({err})") from err


def jsonl_rows(text: str, path: Path, columns: Sequence[str] = COLUMNS,
                required: Sequence[str] = REQUIRED) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, {column: value}) of each non-blank JSON Lines line; null values are left out."""
    for line, content in enumerate(io.StringIO(text, newline=""), start=1):
        if not content.strip():
            continue
        try:
            obj = json.loads(content)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {line}: not valid JSON (column {err.colno}: {err.msg})") from err
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: line {line}: must be a JSON object with {' and '.join(map(repr, required))}, "
                             f"got {describe(obj)}")
        yield line, {k: v for k, v in obj.items() if k in columns and v is not None}


def table_rows(path: Path, what: str, columns: Sequence[str] = COLUMNS,
               required: Sequence[str] = REQUIRED) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, {column: value}) of each row of a .csv, .jsonl or .ndjson table (`what` names it in errors)."""
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: {what} must be a {', '.join(SUFFIXES)} file, got {path.suffix!r}")
    return (csv_rows if kind == "csv" else jsonl_rows)(read_text(path), path, columns, required)
