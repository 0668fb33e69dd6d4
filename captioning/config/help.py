"""`--help` of the Hydra apps (captioning-train, -evaluate, -extract-features) without composing their config.

Hydra answers `--help` by composing the whole configuration (about 0.6 s here) only to fill the help template of
conf/hydra/help/<app>.yaml. Our templates use the help section's own fields (`${hydra.help.header}`, `.footer`)
and `$APP_CONFIG_GROUPS` (every config group under conf/ with its options), which are read here from the files;
a template that needs anything else (`$CONFIG`, `$FLAGS_HELP`, another interpolation) is left to Hydra. The text
is Hydra's to the byte (tests/tools/test_cli_startup.py compares the two). PyYAML and the standard library only.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

import yaml

__all__ = ["HELP_FLAGS", "app_help", "bare_help", "config_groups"]

HELP_FLAGS = ("--help", "-h")
_FIELD = re.compile(r"\$\{hydra\.help\.(\w+)\}")


def config_groups(conf_dir: Path) -> str:
    """Hydra's `$APP_CONFIG_GROUPS`: one line `group: option, ...` per group (nested as `dataset/reader`), sorted;
    Hydra's own groups (hydra/...) left out."""
    groups: dict[str, list[str]] = {}
    for path in conf_dir.rglob("*.yaml"):
        group = path.parent.relative_to(conf_dir).as_posix()
        if group != "." and group.split("/")[0] != "hydra":
            groups.setdefault(group, []).append(path.stem)
    return "".join(f"{group}: {', '.join(sorted(options))}\n" for group, options in sorted(groups.items()))


def app_help(conf_dir: Path, name: str) -> str | None:
    """The help text of conf/hydra/help/<name>.yaml as Hydra prints it, or None when only Hydra can fill it."""
    try:
        spec = yaml.safe_load((conf_dir / "hydra" / "help" / f"{name}.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("template"), str):
        return None
    fields = {key: value for key, value in spec.items() if isinstance(value, str) and key != "template"}
    if any(key not in fields for key in _FIELD.findall(spec["template"])):
        return None
    text = _FIELD.sub(lambda m: fields[m.group(1)], spec["template"])
    template = string.Template(text)
    if "${" in text or not template.is_valid() or set(template.get_identifiers()) - {"APP_CONFIG_GROUPS"}:
        return None
    return template.substitute(APP_CONFIG_GROUPS=config_groups(conf_dir) if "APP_CONFIG_GROUPS" in text else "")


def bare_help(argv: list[str], conf_dir: Path, name: str) -> str | None:
    """For a command line that is only `--help` (or `-h`), the help text for the app to print; None otherwise, or
    when only Hydra can fill it (the app then runs Hydra, which answers the flag itself)."""
    if len(argv) != 1 or argv[0] not in HELP_FLAGS:
        return None
    return app_help(conf_dir, name)
