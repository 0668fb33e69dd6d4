"""Prepared captions: a data set's annotation files read, checked and tokenised once, then opened memory-mapped.

`dataset.prepared` names a folder (by default next to the data). In it, each prepared set is a sub-folder named by
the digest of everything that decides its content:
  - the format version and the tokenizer (`dataset.tokenizer`: for ptb NLTK's Treebank tokenizer and its version,
    lower-casing, no punctuation; captioning/data/tokenizers.py names the others' rules);
  - the reader (`dataset.reader`, every setting, `image_root` and a tokenizer other than ptb included);
  - the SHA-256 of every file the reader reads (its `File()` arguments: annotations, caption files, split file).
A file's hash is computed again only when its size or mtime differs from what a manifest recorded.
`min_word_freq`, `max_vocab` and `max_caption_len` do not decide the content: the set stores every word with its
training count and the captions uncut, and they are applied when it is opened, so a sweep over them shares one set.

A set is written into a temporary folder and renamed into place when complete, with its manifest.json last, so a
half-written set is never used. One that fails to open (a file missing, truncated, or inconsistent) is rebuilt.
A folder that cannot be written (read-only, disk full) leaves the run with its captions in memory and a warning
naming the file that failed (`cannot write FILE: No space left on device`); the temporary folder is removed, and
the next run builds the set again. A set is built under the folder's lock (its `.lock`): processes started together
(a sweep's jobs) build it once, the others wait and open it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from captioning.base.files import write_error
from captioning.base.jsonio import load_json, write_json_atomic
from captioning.base.lock import FolderLock
from captioning.base.signature import file_parameters
from captioning.data.prepared.arrays import CaptionTable
from captioning.data.readers.records import SPLITS, ImageRecord, collector_paused
from captioning.data.tokenizers import DEFAULT_TOKENIZER, rule_id

logger = logging.getLogger(__name__)
FORMAT = "captioning-prepared/v2"  # v2: image paths checked under the image root when read
MANIFEST = "manifest.json"


def tokenizer_id() -> str:
    """Names the tokenizer that `captioning.data.vocab.tokenize` is, with NLTK's version."""
    from importlib.metadata import version

    return f"nltk-treebank-{version('nltk')}/lower/no-punctuation"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _manifests(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The readable manifests of the sets in `root` (whatever their format), newest first."""
    found = []
    for path in root.glob(f"*/{MANIFEST}"):
        with contextlib.suppress(OSError, ValueError):
            manifest = load_json(path)
            if isinstance(manifest, dict):  # another format's too: it tells why a set is rebuilt
                found.append((path.stat().st_mtime, path.parent, manifest))
    return [(folder, m) for _, folder, m in sorted(found, key=lambda x: x[0], reverse=True)]


def source_files(reader: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Path]:
    """The files a reader reads (its `File()` arguments that are set), by argument name."""
    return {k: Path(kwargs[k]) for k in file_parameters(reader) if kwargs.get(k) is not None}


def _file_ids(files: Mapping[str, Path], known: list[tuple[Path, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """path, size, mtime and SHA-256 of each file; a hash is reused when a manifest saw the same path, size, mtime."""
    fields = {"path", "size", "mtime_ns", "sha256"}
    seen = {(f["path"], f["size"], f["mtime_ns"]): f["sha256"] for _, m in known
            for f in m.get("files", {}).values() if isinstance(f, dict) and fields <= set(f)}
    out = {}
    for key, path in files.items():
        st = path.resolve().stat()
        ident: dict[str, Any] = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        ident["sha256"] = seen.get((ident["path"], ident["size"], ident["mtime_ns"])) or _sha256(path)
        out[key] = ident
    return out


def content_key(reader_spec: Mapping[str, Any], files: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What decides a set's content (its folder is named by the digest of this). The reader's `tokenizer` is left
    out where it is ptb: the key of a set made before the choice, which was ptb."""
    tokenizer = str(reader_spec.get("tokenizer", DEFAULT_TOKENIZER))
    reader = {k: v for k, v in reader_spec.items() if k != "tokenizer" or tokenizer != "ptb"}
    rule = tokenizer_id() if tokenizer == "ptb" else rule_id(tokenizer)
    return {"format": FORMAT, "tokenizer": rule, "reader": reader,
            "sources": {k: {"path": f["path"], "sha256": f["sha256"]} for k, f in sorted(files.items())}}


def _digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _differences(new: Any, old: Any, where: str = "") -> list[str]:
    """'where: old -> new' for each leaf that differs between two content keys."""
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        return [d for k in sorted(set(new) | set(old), key=str)
                for d in _differences(new.get(k), old.get(k), f"{where}.{k}" if where else str(k))]
    if new == old:
        return []
    short = lambda v: f"{v[:12]}..." if isinstance(v, str) and len(v) == 64 else repr(v)  # a SHA-256: its start
    return [f"{where}: {short(old)} -> {short(new)}"]


def _why(key: Mapping[str, Any], known: list[tuple[Path, dict[str, Any]]]) -> str:
    """Why no set fits: what differs from the newest one in the folder."""
    if not known:
        return "none prepared in this folder yet"
    folder, manifest = known[0]
    diff = _differences(key, manifest.get("content", {}))
    return f"differs from {folder.name} in {'; '.join(diff[:4])}" + (f" (+{len(diff) - 4} more)" if len(diff) > 4
                                                                       else "")


def _open(folder: Path, key: Mapping[str, Any]) -> CaptionTable:
    """A set, checked: its manifest's content key and file sizes, and the arrays' consistency."""
    manifest = load_json(folder / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("content") != key:
        raise ValueError("its manifest does not describe these settings")
    sizes = manifest.get("sizes")
    if not isinstance(sizes, dict):
        raise ValueError("its manifest lists no file sizes")
    for name, size in sizes.items():
        if not isinstance(name, str) or "/" in name or (folder / name).stat().st_size != size:
            raise ValueError(f"{name} is not the size the manifest records")
    return CaptionTable.load(folder, SPLITS)


def _write(table: CaptionTable, root: Path, name: str, key: Mapping[str, Any],
           files: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write a set into a temporary folder, then rename it to root/name; returns the folder. A failure is a one-line
    OSError naming the file (or folder) that could not be written, and removes the temporary folder."""
    tmp = root / f".{name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as err:
        raise write_error(tmp, err) from err
    try:
        table.save(tmp)
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        counts = {s: {"images": len(a), "captions": len(a.caption_offsets) - 1} for s, a in table.splits.items()}
        write_json_atomic(tmp / MANIFEST, {"format": FORMAT, "content": key, "files": files, "sizes": sizes,
                                           "splits": counts, "words": len(table.words),
                                           "created": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1)
        target = root / name
        if target.is_dir():
            try:
                _open(target, key)
                return target  # another process (a sweep's other job) finished the same set meanwhile
            except (OSError, ValueError):
                shutil.rmtree(target, ignore_errors=True)  # the damaged (or manifest-less) set this one replaces
        try:
            os.rename(tmp, target)
        except OSError as err:
            if not (target / MANIFEST).is_file():  # not another process that finished the same set first
                raise write_error(target, err) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _remove_superseded(known: list[tuple[Path, dict[str, Any]]], key: Mapping[str, Any]) -> None:
    """Delete sets made with the same settings from older contents of the same files (they cannot match again)."""
    for folder, manifest in known:
        old = manifest.get("content", {})
        same_files = {k: f.get("path") for k, f in old.get("sources", {}).items()} == \
            {k: f["path"] for k, f in key["sources"].items()}
        if same_files and {k: v for k, v in old.items() if k != "sources"} == \
                {k: v for k, v in key.items() if k != "sources"} and old != key:
            logger.info("prepared captions: removing %s (made from an earlier version of the same files)", folder)
            shutil.rmtree(folder, ignore_errors=True)


def open_or_prepare(root: str | os.PathLike, reader: Callable[..., Any], reader_spec: Mapping[str, Any],
                    read: Callable[[], Mapping[str, list[ImageRecord]]], write: bool = True) -> CaptionTable:
    """The prepared set of these reader settings and files under `root`, built (and, with `write`, stored) if none fits.

    `reader_spec` is the `dataset.reader` section (its `_target_` and settings); `read()` returns every split's
    records, as the reader reads them.
    """
    root = Path(root)
    known = _manifests(root) if root.is_dir() else []
    files = _file_ids(source_files(reader, {k: v for k, v in reader_spec.items() if k != "_target_"}), known)
    key = content_key(reader_spec, files)
    folder = root / _digest(key)
    start = time.perf_counter()
    if (table := _open_existing(folder, key, start)) is not None:
        return table
    with _building(root, write) as waited:
        if waited and (table := _open_existing(folder, key, start)) is not None:
            return table  # another process (a sweep's other job) built it while this one waited
        logger.info("prepared captions: building %s (%s)", folder, _why(key, known))
        with collector_paused():
            table = CaptionTable.from_records(read())
        if not write:
            return table
        try:
            _write(table, root, folder.name, key, files)
            table = _open(folder, key)  # the run reads what later runs will: the memory-mapped set
        except OSError as err:
            logger.warning("prepared captions could not be written to %s (%s); this run keeps them in memory. Set "
                           "dataset.prepared to a writable folder (or null to read the annotations every time)",
                           root, err)
            return table
        _remove_superseded(known, key)
    logger.info("prepared captions: built %s in %.1f s", folder, time.perf_counter() - start)
    return table


def _open_existing(folder: Path, key: Mapping[str, Any], start: float) -> CaptionTable | None:
    """The set at `folder` if it is there and sound; None (with a warning if it is damaged) otherwise."""
    if not (folder / MANIFEST).is_file():
        return None
    try:
        table = _open(folder, key)
    except (OSError, ValueError) as err:
        logger.warning("prepared captions at %s are damaged (%s); building them again", folder, err)
        return None
    logger.info("prepared captions: opened %s in %.2f s", folder, time.perf_counter() - start)
    return table


@contextlib.contextmanager
def _building(root: Path, write: bool) -> Iterator[bool]:
    """Hold the lock of `root` while a set is built there (yields whether another process held it first):
    processes started together build it once. Without `write`, or where no lock file can be made (a read-only
    folder: nothing will be stored there either), the set is built without one."""
    lock, waited = FolderLock(root, "caption preparation", wait=True), False
    if write:
        try:
            waited = lock.acquire()
        except OSError as err:
            logger.debug("prepared captions: no lock in %s (%s)", root, err)
    try:
        yield waited
    finally:
        lock.release()
