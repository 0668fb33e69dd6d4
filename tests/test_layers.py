"""The package reads from the door: the library never imports an app, no app imports another, no import cycles,
small files and a short top level (ARCHITECTURE.md describes the layers these tests hold)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "captioning"
# The apps: console entry points. Everything else in captioning/ is the library.
APPS = ("captioning.train", "captioning.evaluate", "captioning.tools")
# What the apps share (one-line errors, exit status, option checks): on their side, so the library never imports it.
APP_SHARED = ("captioning.cli",)
MAX_LINES = 300
MAX_TOP_LEVEL_MODULES = 9
# The trainer's files, kept narrow since the second layout step: no line over MAX_WIDTH characters.
NARROW = ("captioning.training.trainer", "captioning.training.run_state", "captioning.training.validation",
          "captioning.training.parts", "captioning.factory.run")
MAX_WIDTH = 110


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The project module an import names (`a.b.c` may be the module a.b with a name c), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def module_imports(name: str) -> Iterator[str]:
    """The project modules `name` imports at module level (TYPE_CHECKING blocks included: they are real
    dependencies of its types). Imports inside functions are left out: they are the deliberate lazy ones."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            nodes += node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                nodes += handler.body
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _resolve(alias.name)) is not None:
                    yield target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if (target := _resolve(f"{base}.{alias.name}")) is not None:
                    yield target


GRAPH = {name: sorted(set(module_imports(name)) - {name}) for name in MODULES}


def _is_app(name: str) -> bool:
    return any(name == app or name.startswith(app + ".") for app in APPS) and name != "captioning.tools"


def test_the_library_never_imports_an_app():
    library = [m for m in GRAPH if not _is_app(m) and m not in APP_SHARED]
    upward = [(m, t) for m in library for t in GRAPH[m] if _is_app(t) or t in APP_SHARED]
    assert not upward, f"library modules importing apps: {upward}"


def test_no_app_imports_another_app():
    across = [(m, t) for m, targets in GRAPH.items() if _is_app(m) for t in targets if _is_app(t)]
    assert not across, f"apps importing apps: {across}"


def _cycle() -> list[str] | None:
    """One import cycle among the project's modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in GRAPH:
        if node not in state and (found := visit(node)):
            return found
    return None


def test_there_are_no_import_cycles():
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


def test_the_walk_sees_real_imports():
    # guards the test itself: known edges are found, with `from a import b` resolved to modules
    assert "captioning.models.decoding" in GRAPH["captioning.models.captioner"]
    assert "captioning.training.trainer" in GRAPH["captioning.factory.run"]


def test_files_stay_small_and_the_top_level_short():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_the_trainer_files_keep_lines_under_110():
    wide = {m: [i for i, line in enumerate(MODULES[m].read_text().splitlines(), 1) if len(line) > MAX_WIDTH]
            for m in NARROW}
    wide = {m: lines for m, lines in wide.items() if lines}
    assert not wide, f"lines over {MAX_WIDTH} characters (module: line numbers): {wide}"


# The floors of ARCHITECTURE.md, lowest first: a module imports its own room and rooms on lower floors only, so
# nothing runs back up. A room is a package of captioning/ or a top-level module ("init": captioning/__init__.py).
FLOORS = [
    {"init", "base", "runtime"},  # declarations and process helpers: import no other room
    {"data"},  # annotation files, captions, the vocabulary, images, the torch data sets
    {"models"},  # the network and its decoding
    {"features"},  # the feature cache: an encoder's grids stored on disk
    {"metrics", "checkpoint"},  # scores; the checkpoint file format
    {"reporting"},  # figures and pages
    {"evaluation"},  # a split decoded, scored and written
    {"training"},  # the Trainer, objectives and losses, what makes a run exact and distributed
    {"factory"},  # the assembly: registry, builders, a run's parts
    {"config", "inference", "export"},  # the config checker, the Python API, the exported model
    {"cli", "train", "evaluate", "tools"},  # the apps and what they share
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def room(module: str) -> str:
    parts = module.split(".")
    return "init" if len(parts) == 1 else parts[1]


def test_every_room_has_a_floor():
    assert {room(m) for m in MODULES} == set(FLOOR)


def test_no_import_runs_back_up_a_floor():
    upward = [(m, t) for m, targets in GRAPH.items() for t in targets if FLOOR[room(t)] > FLOOR[room(m)]]
    assert not upward, f"imports that run back up a floor (see ARCHITECTURE.md): {upward}"


def test_the_model_imports_neither_data_nor_training_and_config_no_model():
    # what the floors imply, said as the rules they hold
    for source, forbidden in (("models", {"data", "training", "factory", "config"}), ("config", {"models"}),
                              ("base", set(FLOOR) - {"base"})):
        bad = [(m, t) for m, targets in GRAPH.items() if room(m) == source for t in targets if room(t) in forbidden]
        assert not bad, bad


def test_no_two_rooms_import_each_other():
    edges = {(room(m), room(t)) for m, targets in GRAPH.items() for t in targets if room(m) != room(t)}
    mutual = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert not mutual, mutual
