"""One default per fact (issue 43, part 4): each decoding default written once, the config groups' shared keys in
one shared file each, and the group choices that select others saying so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from fixtures import compose_config
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import captioning
from captioning.base.decoding import BEAM_SIZE, MAX_LEN, SUPPRESS_UNK
from captioning.metrics.diversity import COLLAPSE_SHARE
from captioning.runtime import CONF_DIR

PACKAGE = Path(captioning.__file__).parent


# -- the decoding defaults ------------------------------------------------------------------------------------------
def test_the_decoding_constants_are_the_eval_configs():
    """A run's beam size and length come from conf/eval/default.yaml, the API's and the commands' from
    captioning/base/decoding.py: the same numbers."""
    shipped = yaml.safe_load((CONF_DIR / "eval" / "default.yaml").read_text())
    assert (shipped["beam_size"], shipped["max_len"], shipped["suppress_unk"]) == (BEAM_SIZE, MAX_LEN, SUPPRESS_UNK)
    assert shipped["collapse_share"] == COLLAPSE_SHARE  # captioning-score's --collapse-share default


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


# -- shared config parts --------------------------------------------------------------------------------------------
def _own_keys(path: Path) -> dict:
    return {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}


DATASETS = sorted(p.stem for p in (CONF_DIR / "dataset").glob("[!_]*.yaml"))
# what a data set changes of the base's defaults list (dataset=table: its reader), and the keys it leaves to the user
READER_OF = {"table": [{"override reader": "table"}]}
LEFT_OPEN = {"table": ["annotations", "image_root"]}  # your own table and its photos


def test_each_data_set_states_only_what_differs_from_the_base():
    base = _own_keys(CONF_DIR / "dataset" / "_base.yaml")
    for name in DATASETS:
        path = CONF_DIR / "dataset" / f"{name}.yaml"
        assert yaml.safe_load(path.read_text())["defaults"] == ["_base", *READER_OF.get(name, []), "_self_"], name
        same = [k for k, v in _own_keys(path).items() if base.get(k, object()) == v]
        assert not same, f"{name}.yaml repeats the base's {same}"
    for name in DATASETS:  # and every key the base leaves open (???) is set
        dataset = compose_config(f"dataset={name}").dataset
        assert [k for k in dataset if OmegaConf.is_missing(dataset, k)] == LEFT_OPEN.get(name, []), name


PAPER = [f"{d}_{a}" for d in ("coco", "flickr8k", "flickr30k") for a in ("soft", "hard")]


def test_the_paper_presets_state_only_their_data_set():
    """The paper's constants are written once (experiment/_paper.yaml, and _paper_soft/_paper_hard.yaml for what each
    attention trains differently); each of the six presets names its data set (flickr8k also its optimizer)."""
    for name in PAPER:
        path = CONF_DIR / "experiment" / f"{name}.yaml"
        assert not _own_keys(path), name
        dataset, attention = name.split("_")
        extra = ["override /optim"] if dataset == "flickr8k" else []
        assert yaml.safe_load(path.read_text())["defaults"] == [
            f"_paper_{attention}", {"override /dataset": dataset}, *({k: "arctic_rmsprop"} for k in extra)]


def test_the_paper_presets_share_their_constants():
    cfgs = {name: compose_config(f"experiment={name}") for name in PAPER}
    for name, cfg in cfgs.items():
        other = cfgs[f"coco_{name.split('_')[1]}"]  # the same attention on COCO: all but the data set (and optimizer)
        assert {k: cfg[k] for k in cfg if k not in ("dataset", "optim")} == \
               {k: other[k] for k in other if k not in ("dataset", "optim")}, name
        assert {k: cfg.dataset[k] for k in ("max_vocab", "batch_size", "batch_unit")} == \
               {"max_vocab": 10000, "batch_size": 64, "batch_unit": "captions"}
    soft, hard = cfgs["coco_soft"], cfgs["coco_hard"]
    for group in ("encoder", "decoder", "trainer"):
        assert soft[group] == hard[group], group
    assert soft.attention.attention_dim == hard.attention.attention_dim == 512


def test_the_shared_parts_are_no_choices_of_their_own():
    from captioning.config.overrides import OverrideError, check_overrides
    for override in ("dataset=_base", "experiment=_paper", "experiment=_paper_soft"):
        with pytest.raises(OverrideError, match="no such choice"):
            check_overrides([override], CONF_DIR, "train")


# -- the tiny run --------------------------------------------------------------------------------------------------
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
DECODERS = sorted(p.stem for p in (CONF_DIR / "decoder").glob("*.yaml"))


@pytest.mark.parametrize("decoder", DECODERS)
def test_debug_tiny_shrinks_whichever_model_is_chosen(decoder, tmp_path):
    """debug=tiny's sizes (conf/debug/*/tiny_<choice>.yaml) fit every choice they name; a choice without a file keeps
    its own; the run itself is the same: 48 / 12 / 12 shapes images of 32 px, 8 a batch."""
    from captioning.config import validate_train_config
    for attention in ATTENTIONS:
        if decoder == "transformer" and attention in ("hard", "location"):
            continue  # refused: tests/models/test_transformer_decoder.py
        cfg = compose_config("debug=tiny", f"dataset.root={tmp_path}", f"decoder={decoder}", f"attention={attention}")
        validate_train_config(cfg)  # no key a chosen group does not take
        sizes = yaml.safe_load(path.read_text()) if (path := CONF_DIR / "debug" / "attention" /
                                                     f"tiny_{attention}.yaml").is_file() else {}
        assert {k: cfg.attention[k] for k in sizes} == sizes, attention
    tiny = yaml.safe_load((CONF_DIR / "debug" / "decoder" / f"tiny_{decoder}.yaml").read_text())
    assert {k: cfg.decoder[k] for k in tiny} == tiny
    assert list(cfg.encoder.channels) == [8, 16] and cfg.dataset.generate.image_size == 32
    assert (cfg.dataset.generate.num_train, cfg.dataset.batch_size, cfg.trainer.progress) == (48, 8, False)


def test_debug_is_off_by_default_and_adds_no_key():
    plain = compose_config()
    assert "debug" not in plain and list(plain.encoder.channels) == [32, 64, 128]


# -- choices that choose for other groups ----------------------------------------------------------------------------
def _implied(*overrides: str) -> list[str]:
    from captioning.config.choices import implied_choices
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    return implied_choices(cfg.hydra.runtime.choices, [CONF_DIR], {o.split("=")[0] for o in overrides})


def test_a_choice_that_chooses_for_other_groups_says_so():
    assert _implied() == []
    assert _implied("decoder=transformer") == [
        "decoder=transformer selects attention=multihead, optim=transformer_adam (conf/decoder/transformer.yaml)"]
    assert _implied("decoder=transformer", "attention=soft") == [  # the command line's choice is its own
        "decoder=transformer selects optim=transformer_adam (conf/decoder/transformer.yaml)"]
    assert _implied("objective=scst") == [
        "objective=scst selects scheduler=none and sets optim.lr, trainer.{max_epochs, patience, monitor, "
        "val_beam_size} (conf/objective/scst.yaml)"]
    assert _implied("experiment=flickr8k_soft")[0] == (  # through _paper_soft.yaml and _paper.yaml
        "experiment=flickr8k_soft selects encoder=vgg19, optim=arctic_rmsprop, scheduler=none, attention=soft, "
        "dataset=flickr8k (conf/experiment/flickr8k_soft.yaml)")


def _help() -> str:
    from captioning.config.help import bare_help
    text = bare_help(["--help"], CONF_DIR, "train")
    assert text is not None
    return " ".join(text.split())


@pytest.mark.parametrize("choice", ["decoder=transformer", "objective=scst", "debug=tiny", "dataset=table"])
def test_the_help_says_what_a_choice_chooses(choice):
    (line,) = _implied(choice)
    said = line.removeprefix(f"{choice} ").rsplit(" (conf/", 1)[0]
    help_text = _help()
    entry = help_text[help_text.index("Choices that choose for other groups"):]
    entry = entry[entry.index(f" {choice} "):]
    entry = entry[:entry.index("(conf/")]
    for part in said.replace(" and ", ", ").removeprefix("selects ").split(", "):
        name = part.removeprefix("sets ").removeprefix("selects ")
        assert name in entry, (name, entry)


def test_the_help_states_the_default_runs_schedule():
    cfg, text = compose_config(), _help()
    assert f"has not improved for {cfg.trainer.patience} epochs (at most {cfg.trainer.max_epochs};" in text
    assert "10 minutes" not in text


def test_a_run_logs_what_its_choices_chose(caplog):
    from hydra.core.hydra_config import HydraConfig

    from captioning.train import log_implied_choices
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["decoder=transformer"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        with caplog.at_level("INFO", logger="captioning.train"):
            log_implied_choices()
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]  # outside a Hydra app again, for the tests after
    assert not HydraConfig.initialized()
    assert caplog.messages == [
        "decoder=transformer selects attention=multihead, optim=transformer_adam (conf/decoder/transformer.yaml)"]
