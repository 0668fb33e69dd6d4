"""The build step that puts the config groups into the package: conf/ (the one place they are edited) is copied
into captioning/conf/ of every wheel, so an installed captioning finds them (captioning/runtime.py, CONF_DIR).
An editable install (`pip install -e .`) reads conf/ where it is and copies nothing. Everything else about the
package is in pyproject.toml; MANIFEST.in puts conf/ into the source distribution a wheel may be built from."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path(__file__).resolve().parent / "conf"


class BuildWithConf(build_py):
    """build_py, then conf/ copied whole (YAML files and any other file in it) to captioning/conf/ of the build."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            if not (CONF / "train.yaml").is_file():
                raise SystemExit(f"captioning: no config groups at {CONF} (conf/train.yaml); build from a checkout "
                                 "or from the source distribution, which carry conf/")
            target = Path(self.build_lib) / "captioning" / "conf"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(CONF, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        files = [str(Path(self.build_lib) / "captioning" / "conf" / p.relative_to(CONF))
                 for p in sorted(CONF.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
        return [*super().get_outputs(include_bytecode), *([] if self.editable_mode else files)]


setup(cmdclass={"build_py": BuildWithConf})
