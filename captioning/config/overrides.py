"""Command-line overrides checked before Hydra starts: a typo'd group, choice or key is one line with a did-you-mean.

Hydra's own messages for these mistakes are several lines long and point the wrong way ("use +atention=hard" for a
misspelt group, "Key 'dropuot' is not in struct" with no suggestion). `check_overrides` runs first and names the
mistake: `atention=hard: unknown config group or key (did you mean 'attention'?)`,
`attention=sofft: no such choice in attention/ (choose one of ...; did you mean 'soft'?)`,
`decoder.dropuot=0.2: unknown key (did you mean 'dropout'?)`. Overrides with a `+`, `++` or `~` prefix, Hydra's own
`hydra.*` keys and sweeps' later values are left to Hydra; values are checked after composition by the schema.

A user's own config folders, added with Hydra's `hydra.searchpath=[file://my_conf]`, count as part of conf/: their
groups and options are known here (conf/ first where both have a file, as in Hydra), and a folder that does not
exist is one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from captioning.config.check import did_you_mean


class OverrideError(ValueError):
    """A command-line override that names no config group, choice or key."""


def _choices(conf_dirs: Sequence[Path], group: str) -> list[str]:
    """A group's options; a file named _*.yaml is a part other options extend (conf/objective/_terms.yaml)."""
    return sorted({p.stem for d in conf_dirs for p in (d / group).glob("*.yaml") if not p.stem.startswith("_")})


def _groups(conf_dirs: Sequence[Path]) -> list[str]:
    """Config groups under conf/ (folders with YAML files), nested ones as 'dataset/reader'; hydra/ is Hydra's."""
    return sorted({p.parent.relative_to(d).as_posix() for d in conf_dirs for p in d.rglob("*.yaml")
                   if p.parent != d and p.parent.relative_to(d).parts[0] != "hydra"})


def searched_folder(entry: Any) -> Path | None:
    """The folder of one `hydra.searchpath` entry, `file://my_conf` (a relative one from the current folder, as
    Hydra reads it); None for an entry that is not a file:// path (`pkg://` entries are Hydra's alone)."""
    if isinstance(entry, str) and entry.startswith("file://"):
        return Path(entry.removeprefix("file://")).absolute()
    return None


def search_dirs(searchpaths: Sequence[Override]) -> list[Path]:
    """The folders of `hydra.searchpath=[file://A,file://B]` overrides; OverrideError for one that is not there."""
    dirs = []
    for override in searchpaths:
        entries = override.value()
        for entry in entries if isinstance(entries, list) else [entries]:
            if (folder := searched_folder(entry)) is not None:
                if not folder.is_dir():
                    raise OverrideError(f"{override.input_line}: no folder {folder} (a config folder to search: give "
                                        "its path after file://, absolute or from the current folder)")
                dirs.append(folder)
    return dirs


def _has_key(cfg: Any, dotted: str) -> tuple[bool, str, list[str]]:
    """Whether `dotted` exists in cfg; else the first missing part and the keys that exist at its level."""
    node, parts = cfg, dotted.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):  # a list's item (encoders.1)
            node = node[int(part)]
            continue
        if not isinstance(node, DictConfig) or part not in node.keys():
            keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else \
                [str(k) for k in range(len(node))] if isinstance(node, ListConfig) else []
            return False, ".".join(parts[: i + 1]), keys
        if i == len(parts) - 1:
            break  # found: its value is not read (a ??? one, e.g. dataset=table's annotations, is set by this override)
        node = node[part]
    return True, "", []


def check_overrides(argv: Sequence[str], conf_dir: Path, config_name: str,
                    validate: Callable[[DictConfig], None] | None = None) -> None:
    """Raise OverrideError for the first override that names an unknown group, choice or key (see the docstring).

    With `validate` (the app's config check), a single run's composed config is checked here too, so a bad value,
    a missing file or a device this machine lacks fails before Hydra makes a run folder. It runs after the names are
    checked: an app that imports its heavy check inside `validate` answers a typo at once. A sweep (`-m`, `a,b`)
    and Hydra's own flags (`--cfg`, `-cd`, ...) are left to the run, which checks its config again in any case."""
    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException as err:
        raise OverrideError(f"cannot parse the overrides: {str(err).splitlines()[0]}") from None
    searchpaths = [o for o in overrides if o.key_or_group == "hydra.searchpath" and not o.is_delete()]
    conf_dirs = [conf_dir, *search_dirs(searchpaths)]
    searched = [str(o.input_line) for o in searchpaths]  # composed with every config below
    groups = _groups(conf_dirs)
    chosen: list[str] = []  # group choices (their first value), which decide the keys that exist
    plain = [o for o in overrides if not (o.is_add() or o.is_force_add() or o.is_delete())
             and not o.key_or_group.startswith("hydra")]
    validating = validate is not None and not any(a.startswith("-") for a in argv) and not any(
        o.is_sweep_override() for o in overrides)
    if not plain and not validating:
        return  # nothing to check (`--help`, `--cfg job`): no config composed for nothing
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        top = compose(config_name, overrides=searched)
        for o in plain:
            key, text = o.key_or_group, o.input_line
            if key in groups:
                sweep = o.is_sweep_override()
                values = [str(v) for v in o.sweep_string_iterator()] if sweep else [o.get_value_element_as_str()]
                for value in values:
                    options = _choices(conf_dirs, key)
                    if value not in options and value != "null":
                        hint = did_you_mean(value, options).strip(" ()") or ""
                        raise OverrideError(f"{text}: no such choice in {key}/ (choose one of {', '.join(options)}"
                                            f"{'; ' + hint if hint else ''})")
                chosen.append(f"{key}={values[0]}")
            elif "." not in key and key not in top.keys():  # keys(): a ??? value counts as present
                names = sorted({*groups, *(str(k) for k in top.keys())})
                raise OverrideError(f"{text}: unknown config group or key{did_you_mean(key, names)}")
        try:
            cfg = compose(config_name, overrides=[*searched, *chosen]) if chosen else top  # else the same config
        except (HydraException, OmegaConfBaseException):
            return  # a choice that does not compose is Hydra's to report
    for o in plain:
        key = o.key_or_group
        if "." in key and key not in groups:
            found, missing, keys = _has_key(cfg, key)
            if not found and OmegaConf.select(cfg, missing.rsplit(".", 1)[0] if "." in missing else "") is not None:
                what = "key" if "." in missing else "config group or key"
                raise OverrideError(f"{o.input_line}: unknown {what}{did_you_mean(missing.rsplit('.', 1)[-1], keys)} "
                                    f"(to add a new key, write +{o.input_line})")
    if validate is not None and validating:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            try:
                full = compose(config_name, overrides=[*searched, *(str(o.input_line) for o in overrides
                                                                     if not o.key_or_group.startswith("hydra"))])
            except (HydraException, OmegaConfBaseException):
                return  # Hydra reports it when it composes the same overrides
        validate(full)
