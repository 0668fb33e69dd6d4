"""Image paths that annotation files give must name files under the image root (SECURITY.md: such files are data).

Two checks, shared by the Karpathy, COCO caption and table readers:
- `relative_problem`, on the text a file gives (a Karpathy `filepath`/`filename`, a COCO `file_name`, a table's
  `image`): an absolute path (POSIX `/x`, Windows `C:\\x` or `\\\\server`), a `..` component, a NUL byte or a
  name that names nothing is refused;
- `ImageRoot.escape`, on disk: the path, resolved, must stay under the resolved root. Symlinks that stay inside
  the root are followed, and the root may itself be a symlink; a symlink (to a file or a folder) whose target
  leaves the root is refused. A missing file is not refused here: the data set counts missing images as skipped.
`ImageRoot.problem` runs both on one file name (what a COCO `file_name` or a table's `image` is).

The disk check is cheap enough for COCO (123,287 images): each distinct folder is resolved once, each file is
`lstat`ed once, and only files that are symlinks are resolved.
"""

from __future__ import annotations

import os
import re
import stat
import string

_SEPARATORS = re.compile(r"[/\\]")


def relative_problem(text: str, folder: bool = False) -> str | None:
    """What is wrong with `text` as a path relative to the image root, or None; a `folder` may be empty or '.'.

    Plain string tests (run on every entry of a COCO-sized file): `/x`, `\\x` and `C:x` are what PurePosixPath
    and PureWindowsPath call absolute or anchored.
    """
    if "\0" in text:
        return f"must not contain a NUL byte, got {text!r:.80}"
    if text[:1] in ("/", "\\") or (text[1:2] == ":" and text[:1] in string.ascii_letters):
        return f"must be a path relative to the image root, got the absolute path {text!r:.80}"
    if ".." in text and ".." in _SEPARATORS.split(text):
        return f"must stay under the image root (no '..'), got {text!r:.80}"
    if not folder and not text.strip("/.") and all(part in ("", ".") for part in text.split("/")):
        return f"names no file, got {text!r:.80}"
    return None


class ImageRoot:
    """An image root, resolved once, that tells where the files under it resolve (each folder resolved once)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        self.real = os.path.realpath(self.root)
        self._prefix = self.real if self.real.endswith(os.sep) else self.real + os.sep
        self._folders: dict[str, bool] = {}  # folder as joined -> whether it resolves under the root

    def inside(self, real: str) -> bool:
        """Whether a resolved path is the root or under it."""
        return real == self.real or real.startswith(self._prefix)

    def problem(self, name: str) -> str | None:
        """What is wrong with `name`, a file's path as an annotation file gives it, under this root, or None."""
        if problem := relative_problem(name):
            return problem
        joined = os.path.join(self.root, name)
        real = self.escape(joined)
        return None if real is None else self.describe(joined, real)

    def escape(self, path: str) -> str | None:
        """Where `path` (root-joined, already string-checked) resolves when that is outside the root; else None."""
        folder = os.path.dirname(path)
        inside = self._folders.get(folder)
        if inside is None:
            inside = self._folders[folder] = self.inside(os.path.realpath(folder))
        if inside:
            try:
                if not stat.S_ISLNK(os.lstat(path).st_mode):
                    return None
            except OSError:  # missing (or unreadable): skipped and counted when the images are loaded
                return None
        real = os.path.realpath(path)
        return None if self.inside(real) else real

    def describe(self, path: str, real: str) -> str:
        """Why `path` is refused: it resolves to `real`, outside the root, through a symlink."""
        shown = os.path.relpath(path, self.root)
        root = self.root if self.real == os.path.abspath(self.root) else f"{self.root} (= {self.real})"
        return f"must stay under the image root {root}, but {shown} resolves to {real} through a symlink"
