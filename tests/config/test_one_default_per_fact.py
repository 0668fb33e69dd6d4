"""One default per fact (issue 43, part 4): each decoding default written once, the config groups' shared keys in
one shared file each, and the group choices that select others saying so."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

import captioning
from captioning.base.decoding import BEAM_SIZE, MAX_LEN
from captioning.runtime import CONF_DIR

PACKAGE = Path(captioning.__file__).parent


# -- the decoding defaults ------------------------------------------------------------------------------------------
def test_the_decoding_constants_are_the_eval_configs():
    """A run's beam size and length come from conf/eval/default.yaml, the API's and the commands' from
    captioning/base/decoding.py: the same numbers."""
    shipped = yaml.safe_load((CONF_DIR / "eval" / "default.yaml").read_text())
    assert (shipped["beam_size"], shipped["max_len"]) == (BEAM_SIZE, MAX_LEN)


def _literal_defaults(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every beam_size / max_len parameter, and --beam-size / --max-len option, whose default is
    a number written in place."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
                     *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)]
            found += [(d.lineno, a.arg) for a, d in pairs  # an @overload's `...` is no default
                      if a.arg in ("beam_size", "max_len") and isinstance(d, ast.Constant) and d.value is not ...]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in ("--beam-size", "--max-len"):
            found += [(k.lineno, node.args[0].value) for k in node.keywords
                      if k.arg == "default" and isinstance(k.value, ast.Constant)]
    return found


# Where `max_len` names another fact: where training captions are cut (the dataset's max_caption_len), and the
# length of SCST's sampled captions (objective.max_len, conf/objective/scst.yaml's: tests/config/test_defaults.py).
OTHER_FACTS = {("data",), ("training", "objectives.py")}


def test_no_decoding_default_is_written_in_place():
    """Every default beam size and caption length of the library and its commands reads captioning/base/decoding.py."""
    written = [f"{path.relative_to(PACKAGE.parent)}:{line} {name}" for path in sorted(PACKAGE.rglob("*.py"))
               if not any(path.relative_to(PACKAGE).parts[:len(p)] == p for p in OTHER_FACTS)
               for line, name in _literal_defaults(ast.parse(path.read_text(encoding="utf-8")))]
    assert not written, written


def test_the_scan_finds_a_default_written_in_place():
    tree = ast.parse("def f(x, beam_size=3, *, max_len: int = 20): ...\n"
                     "p.add_argument('--beam-size', type=int, default=3)\n"
                     "def g(beam_size=BEAM_SIZE, max_len: int = ...): ...\n")
    assert _literal_defaults(tree) == [(1, "beam_size"), (1, "max_len"), (2, "--beam-size")]
