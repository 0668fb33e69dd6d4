"""Config checking: every shipped config validates; bad ones fail before any work, naming the key.

Typed groups are checked against captioning/config/schema.py, `_target_` groups against their target's signature
(with the constraints the constructor itself enforces), so a new `_target_` group needs no schema edit.
"""

import functools
import logging
import sys
import typing
from pathlib import Path
from typing import Annotated, Literal

import pytest
import yaml
from fixtures import compose_config
from omegaconf import OmegaConf

from captioning import evaluate, train
from captioning.base.constraints import Range, constrained
from captioning.config import schema, targets
from captioning.config.schema import ConfigError, validate_evaluate_config, validate_train_config
from captioning.data.shapes.generate import build_shapes
from captioning.factory import registry
from captioning.metrics import VALID_METRICS
from captioning.models.attention import HardAttention, SoftAttention
from captioning.models.decoders.sat import ShowAttendTellDecoder
from captioning.models.encoder import SmallCNN
from captioning.runtime import CONF_DIR

CONF = CONF_DIR
GROUPS = ("dataset", "encoder", "attention", "decoder", "optim", "scheduler", "eval")


@pytest.fixture
def real_files(tmp_path):
    """An annotation file and an image folder, so data sets other than the generated `shapes` pass the path
    checks (dataset/reader=coco reads the two caption files instead)."""
    (tmp_path / "images").mkdir()
    for name in ("split.json", "train_captions.json", "val_captions.json"):
        (tmp_path / name).write_text("{}")
    return [f"dataset.annotations={tmp_path / 'split.json'}", f"dataset.image_root={tmp_path / 'images'}"]


def _entries(group):
    """A group's choices (a _*.yaml file is a part the others extend: objective/_terms.yaml, dataset/_base.yaml)."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_entry_validates(group, real_files):
    for entry in _entries(group):
        validate_train_config(compose_config(f"{group}={entry}", *real_files))


@pytest.mark.parametrize("preset", _entries("experiment"))
def test_every_preset_validates(preset, real_files, tmp_path):
    regions = [f"dataset.features={tmp_path / 'images'}"] if preset.endswith("_bu") else []  # a region folder
    validate_train_config(compose_config(f"experiment={preset}", *real_files, *regions))


def test_the_coco_reader_checks_its_caption_files(tmp_path, real_files):
    files = [f"dataset.reader.train_captions={tmp_path / 'train_captions.json'}",
             f"dataset.reader.val_captions={tmp_path / 'val_captions.json'}", f"dataset.image_root={tmp_path}"]
    validate_train_config(compose_config("dataset=coco", "dataset/reader=coco", *files))
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config("dataset=coco", "dataset/reader=coco", *files[1:]))
    assert [key for key, _ in err.value.problems] == ["dataset.reader.train_captions"]
    assert ("dataset.reader.train_captions='data/coco/annotations/captions_train2014.json': file not found; "
            "set dataset.reader.train_captions=PATH") in str(err.value)
    with pytest.raises(ConfigError, match=r"dataset\.reader\.num_vall: unknown key \(did you mean 'num_val'\?\)"):
        validate_train_config(compose_config("dataset=coco", "dataset/reader=coco", *files, "+dataset.reader.num_vall=1"))


def _targets_in_conf():
    """(config key, `_target_`) of every group file in conf/ that names one (Hydra's own launchers aside)."""
    for path in sorted(CONF.rglob("*.yaml")):
        group = path.parent.relative_to(CONF).as_posix()
        data = yaml.safe_load(path.read_text()) or {}
        if group == "dataset" and isinstance(data.get("generate"), dict):
            yield "dataset.generate", data["generate"]["_target_"]
        elif group not in ("", "experiment", "dataset") and not group.startswith("hydra") and "_target_" in data:
            yield group.replace("/", "."), data["_target_"]


def test_every_target_in_conf_is_one_the_validator_can_check():
    found = list(_targets_in_conf())
    assert {key for key, _ in found} == {"encoder", "attention", "decoder", "optim", "scheduler", "dataset.generate",
                                         "dataset.reader", "objective"}
    for key, target in found:
        table, _, _ = targets.targets_at(key)
        assert target in table, (key, target)


def test_the_schema_holds_no_defaults_and_its_lists_are_the_code_s():
    # TypedDicts cannot carry defaults: conf/ is the only place a default lives.
    groups = [v for v in vars(schema).values() if isinstance(v, type) and v.__module__ == schema.__name__]
    assert groups and all(typing.is_typeddict(g) for g in groups)
    assert set(schema.METRICS) == set(VALID_METRICS)
    # The choices the validator offers are the constructor's own (one Literal in its signature).
    assert typing.get_args(typing.get_type_hints(HardAttention.__init__)["test_mode"]) == HardAttention.TEST_MODES


BAD = [  # (overrides, the message line that must appear)
    (["optim.lr=-0.1"], "optim.lr=-0.1: must be > 0"),
    (["eval.beam_size=0"], "eval.beam_size=0: must be >= 1"),
    (["trainer.val_beam_size=0"], "trainer.val_beam_size=0: must be >= 1"),
    (["decoder.dropout=1.0"], "decoder.dropout=1.0: must be < 1"),
    (["dataset.batch_size=0"], "dataset.batch_size=0: must be >= 1"),
    (["attention=hard", "attention.expected_context_prob=1.5"], "attention.expected_context_prob=1.5: must be <= 1"),
    (["attention=hard", "attention.test_mode=argmx"],
     "attention.test_mode='argmx': choose one of expectation, argmax, sample (did you mean 'argmax'?)"),
    (["attention._target_=sofft"], "attention: unknown type 'sofft'; choose one of soft, "),
    (["attention._target_=captioning.models.attention.SoftAttention"],
     "attention._target_: 'captioning.models.attention.SoftAttention' is now named 'soft'"),
    (["encoder=vgg16", "encoder.arch=vgg17"], "encoder.arch='vgg17': choose one of vgg11, "),
    (["encoder=resnet50", "encoder.fine_tune=last"], "encoder.fine_tune='last': choose one of none, top, all"),
    (["trainer.monitor=cider"], "trainer.monitor='cider' is not computed during validation; choose one of "),
    (["device=gpu"], "device='gpu': must be auto, cpu, mps, cuda or cuda:N"),
    (["eval.metrics=[bleu,cidre]"], "eval.metrics[1]='cidre': choose one of bleu, meteor, rouge, cider, spice"),
    (["seed=abc"], "seed='abc': must be an integer"),
    (["+optim.lrr=0.1"], "optim.lrr: unknown key (did you mean 'lr'?)"),
    (["scheduler=plateau", "scheduler.mode=min"], "scheduler.mode='min': must be 'max'"),
    (["scheduler.gamma=1.5"], "scheduler.gamma=1.5: must be"),
    (["resume=no/such/last.pt"], "resume='no/such/last.pt': checkpoint not found"),
    (["dataset=flickr8k", "data_dir=nowhere", f"dataset.image_root={CONF}"],
     "dataset.annotations='nowhere/flickr8k/dataset_flickr8k.json': file not found; set dataset.annotations=PATH"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[o[-1].split("=")[0] for o, _ in BAD])
def test_invalid_config_is_rejected_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config(*overrides))
    assert message in str(err.value)
    assert len(err.value.problems) == 1  # nothing else is reported


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config("optim.lr=0", "eval.beam_size=0", "decoder.embed_dim=-3"))
    assert [key for key, _ in err.value.problems] == ["decoder.embed_dim", "optim.lr", "eval.beam_size"]
    assert str(err.value).startswith("invalid configuration (3 problems):\n  decoder.embed_dim=-3: must be >= 1")


def test_a_typo_in_a_preset_file_is_caught():
    # Hydra merges new keys from YAML files without complaint; the schema does not.
    cfg = compose_config()
    OmegaConf.set_struct(cfg, False)
    cfg.decoder.dropuot = 0.3
    cfg.trainer.max_epoch = 3
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    assert {p[0] for p in err.value.problems} == {"decoder.dropuot", "trainer.max_epoch"}
    assert "did you mean 'dropout'?" in str(err.value) and "did you mean 'max_epochs'?" in str(err.value)


def test_missing_and_unresolvable_values():
    cfg = compose_config()
    OmegaConf.set_struct(cfg, False)
    del cfg.trainer["patience"]
    with pytest.raises(ConfigError, match=r"trainer.patience: missing; this key is required"):
        validate_train_config(cfg)
    with pytest.raises(ConfigError, match=r"data_dir: cannot resolve"):
        validate_train_config(compose_config("data_dir=${oc.env:CAPTIONING_TEST_UNSET_VARIABLE}"))


def test_evaluate_config(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint: missing value \(\?\?\?\); set it on the command line"):
        validate_evaluate_config(compose_config(name="evaluate"))
    with pytest.raises(ConfigError, match="checkpoint='nope.pt': checkpoint not found"):
        validate_evaluate_config(compose_config("checkpoint=nope.pt", name="evaluate"))
    (tmp_path / "best.pt").write_bytes(b"")
    validate_evaluate_config(compose_config(f"checkpoint={tmp_path / 'best.pt'}", name="evaluate"))
    with pytest.raises(ConfigError, match="eval.instances='none.json': file not found"):
        validate_evaluate_config(compose_config(f"checkpoint={tmp_path / 'best.pt'}", "eval.instances=none.json",
                                          name="evaluate"))


# -- through the real console entry points: the error is printed and nothing is created or read ----------
def _run_app(module, args, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [module.__name__, *args, f"hydra.run.dir={tmp_path / 'run'}"])
    # Hydra's job logging points the root logger at this test's captured stderr; later tests must not log there.
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    with pytest.raises(SystemExit) as exit_:
        module.main()
    return exit_.value.code


def test_train_entry_point_fails_before_any_work(monkeypatch, tmp_path, capsys):
    code = _run_app(train, ["optim.lr=-0.1", "+decoder.dropuot=0.2", f"data_dir={tmp_path / 'data'}"],
                    monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and "optim.lr=-0.1: must be > 0" in err and "decoder.dropuot: unknown key (did you mean" in err
    assert not (tmp_path / "data").exists()  # shapes was not generated
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "config.yaml").exists()


def test_unknown_group_choice_is_one_line_with_the_choices(monkeypatch, tmp_path, capsys):
    assert _run_app(train, ["attention=sofft"], monkeypatch, tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attention=sofft: no such choice in attention/" in err
    assert all(choice in err for choice in _entries("attention")) and "did you mean 'soft'?" in err


def test_evaluate_entry_point_fails_before_loading(monkeypatch, tmp_path, capsys):
    assert _run_app(evaluate, ["checkpoint=missing.pt", "eval.beam_size=0"], monkeypatch, tmp_path) == 2
    err = capsys.readouterr().err
    assert "checkpoint='missing.pt': checkpoint not found" in err and "eval.beam_size=0: must be >= 1" in err


def test_keys_of_the_shipped_yaml_files_are_accepted(monkeypatch, tmp_path):
    # A key another module adds to conf/dataset/*.yaml (or trainer in train.yaml) validates before the schema
    # learns its type; the same key in a user's override is still a typo.
    import captioning.config.schema as schema

    conf = tmp_path / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset" / "mine.yaml").write_text("name: mine\nshards: 4\n")
    (conf / "train.yaml").write_text("trainer:\n  ema_decay: 0.999\n")
    monkeypatch.setattr(schema, "CONF_DIR", conf)
    cfg = compose_config()
    OmegaConf.set_struct(cfg, False)
    cfg.dataset.shards, cfg.trainer.ema_decay, cfg.eval.shards = 4, 0.999, 4
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    assert [key for key, _ in err.value.problems] == ["eval.shards"]


# -- one copy of each range: the constructor declares it, the validator surfaces it before any work -------------
RANGES = [  # (override, the validator's line, the same check when the class is called directly, its message)
    ("attention.attention_dim=0", "attention.attention_dim=0: must be >= 1",
     lambda: SoftAttention(8, 8, attention_dim=0), "SoftAttention: attention_dim=0: must be >= 1"),
    ("decoder.init_layers=0", "decoder.init_layers=0: must be >= 1",
     lambda: ShowAttendTellDecoder(12, 8, functools.partial(SoftAttention, attention_dim=4), init_layers=0),
     "ShowAttendTellDecoder: init_layers=0: must be >= 1"),
    ("encoder.channels=[8,0]", "encoder.channels[1]=0: must be >= 1",
     lambda: SmallCNN(channels=(8, 0)), "SmallCNN: channels[1]=0: must be >= 1"),
    ("dataset.generate.image_size=16", "dataset.generate.image_size=16: must be >= 32",
     lambda: build_shapes("never-written", image_size=16), "build_shapes: image_size=16: must be >= 32"),
]


@pytest.mark.parametrize(("override", "line", "call", "message"), RANGES, ids=[r[0].split("=")[0] for r in RANGES])
def test_a_constructor_range_is_checked_by_the_validator_and_by_the_constructor(override, line, call, message):
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config(override))
    assert [str(err.value).splitlines()[1].strip()] == [line]
    with pytest.raises(ValueError) as direct:
        call()
    assert str(direct.value) == message
    assert not Path("never-written").exists()


def test_a_constructor_range_fails_the_entry_point_before_anything_is_built(monkeypatch, tmp_path, capsys):
    built = []  # train.py imports build_trainer when a run starts: patched where it lives
    monkeypatch.setattr("captioning.factory.run.build_trainer", lambda *a: built.append(a))  # never reached
    code = _run_app(train, ["attention.attention_dim=0", "dataset.generate.num_val=0", f"data_dir={tmp_path / 'data'}"],
                    monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and "attention.attention_dim=0: must be >= 1" in err and "dataset.generate.num_val=0" in err
    assert not built and not (tmp_path / "data").exists() and not (tmp_path / "run" / "config.yaml").exists()


# -- a `_target_` group the schema has never heard of ------------------------------------------------------------
@constrained
def weighted_objective(vocab_size: int, weight: Annotated[float, Range(ge=0)],
                       reduction: Literal["mean", "sum"] = "mean") -> None:
    """A stand-in for a component someone adds later (a conf/objective/ group)."""


def _objective(spec: str):
    """The default config with its objective group replaced by `spec` (a YAML mapping)."""
    cfg = compose_config()
    cfg.objective = OmegaConf.create(yaml.safe_load(spec))
    return cfg


def test_a_new_target_group_is_checked_by_its_signature_without_schema_edits(monkeypatch):
    target = f"{__name__}.weighted_objective"
    monkeypatch.setitem(registry.GROUPS, "objective", {target: weighted_objective})
    monkeypatch.setitem(registry.BUILDER_ARGS, "objective", ("vocab_size",))
    validate_train_config(_objective(f"{{_target_: {target}, weight: 0.5}}"))
    with pytest.raises(ConfigError) as err:
        validate_train_config(_objective(f"{{_target_: {target}, weight: -1, reduction: meen, vocab_size: 3, "
                                         "weigth: 1}"))
    assert err.value.problems == [
        ("objective.weight", "=-1: must be >= 0"),
        ("objective.reduction", "='meen': choose one of mean, sum (did you mean 'mean'?)"),
        ("objective.vocab_size", "set by the code that builds weighted_objective, not by a config"),
        ("objective.weigth", "unknown key (did you mean 'weight'?)")]
    with pytest.raises(ConfigError, match=r"objective: unknown type 'os.makedirs'; choose one of weighted_objective"):
        validate_train_config(_objective("{_target_: os.makedirs, name: x}"))
    monkeypatch.delitem(registry.GROUPS, "objective")  # unregistered: refused, its target never looked up
    with pytest.raises(ConfigError, match=r"objective: a _target_ group this project cannot check"):
        validate_train_config(_objective(f"{{_target_: {target}, weight: 0.5}}"))


# -- the data reader, chosen by `_target_` ----------------------------------------------------------------------
def test_the_reader_is_a_registered_target_checked_by_its_signature(real_files):
    cfg = compose_config(*real_files)
    assert cfg.dataset.reader._target_ == "karpathy"
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config("dataset.reader._target_=os.makedirs"))
    assert err.value.problems == [("dataset.reader", ("unknown type 'os.makedirs'; choose one of karpathy, coco, "
                                   "table (a new one needs its line in captioning/factory/registry.py)"))]
    with pytest.raises(ConfigError, match=r"dataset\.reader\.splits: set by the code that builds read_karpathy_splits"):
        validate_train_config(compose_config("+dataset.reader.splits=[train]"))
