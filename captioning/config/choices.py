"""What a config group's choice also chooses, read from its file: the `override /GROUP: OPTION` entries of its
defaults list (decoder=transformer selects attention=multihead and optim=transformer_adam) and, for a
`@package _global_` group file (objective=scst), the keys it sets outside its own group. captioning-train logs
them at the start of a run, so a choice that changes other groups says so where a user sees it."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

GLOBAL = "# @package _global_"


def _path(conf_dirs: Sequence[Path], group: str, option: str) -> Path | None:
    """A group file in the first folder that has it (conf/, then a user's hydra.searchpath folders, as Hydra reads)."""
    return next((p for d in conf_dirs if (p := d / group / f"{option}.yaml").is_file()), None)


def _file(conf_dirs: Sequence[Path], group: str, option: str) -> tuple[dict[str, Any], bool]:
    """A group file's content and whether it is `@package _global_` ({} for a file that is not there)."""
    if (path := _path(conf_dirs, group, option)) is None:
        return {}, False
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    return (data if isinstance(data, dict) else {}), GLOBAL in text.split("\n", 3)[:3]


def _overrides(conf_dirs: Sequence[Path], group: str, option: str, seen: set[str]) -> Iterator[tuple[str, str]]:
    """(group, option) of every `override` entry in a file's defaults list and in the same group's parts it
    extends (experiment=coco_soft -> _paper_soft -> _paper), in the order Hydra reads them."""
    if option in seen:
        return
    seen.add(option)
    data, _ = _file(conf_dirs, group, option)
    for entry in data.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":  # a part of the same group this file extends
            yield from _overrides(conf_dirs, group, entry.split("@")[0], seen)
        elif isinstance(entry, dict):
            for key, value in entry.items():
                if isinstance(key, str) and key.startswith("override ") and isinstance(value, str):
                    target = key.removeprefix("override ").split("@")[0]
                    yield (target[1:] if target.startswith("/") else f"{group}/{target}"), value


def _global_keys(conf_dirs: Sequence[Path], group: str, option: str) -> list[str]:
    """The sections (and their keys) a `@package _global_` group file sets outside its own group."""
    data, is_global = _file(conf_dirs, group, option)
    if not is_global:
        return []
    out = []
    for section, value in data.items():
        if section in ("defaults", group.split("/")[0]):
            continue
        keys = list(value) if isinstance(value, dict) else []
        out.append(section if not keys else f"{section}.{keys[0]}" if len(keys) == 1
                   else f"{section}.{{{', '.join(map(str, keys))}}}")
    return out


def implied_choices(choices: Mapping[str, str | None], conf_dirs: Sequence[Path],
                    chosen: Collection[str] = ()) -> list[str]:
    """One line for each group choice that also selects another group's option or sets another group's keys, e.g.
    'decoder=transformer selects attention=multihead, optim=transformer_adam (conf/decoder/transformer.yaml)'.
    `choices`: Hydra's runtime choices (group -> option); `conf_dirs`: conf/, then a user's config folders (a
    file of theirs is named by its full path); `chosen`: the groups the command line chose, whose choice no file
    made. A selection a later choice replaced is not named."""
    lines = []
    for group, option in choices.items():
        if option is None or group.startswith("hydra"):
            continue
        selects = [f"{g}={o}" for g, o in dict(_overrides(conf_dirs, group, option, set())).items()
                   if choices.get(g) == o and g not in chosen and g != group]
        sets = [] if group == "experiment" else _global_keys(conf_dirs, group, option)  # a preset may set anything
        said = [*(["selects " + ", ".join(selects)] if selects else []), *(["sets " + ", ".join(sets)] if sets else [])]
        if said:
            path = _path(conf_dirs, group, option)
            where = f"conf/{group}/{option}.yaml" if path is None or path.is_relative_to(conf_dirs[0]) else path
            lines.append(f"{group}={option} {' and '.join(said)} ({where})")
    return lines
