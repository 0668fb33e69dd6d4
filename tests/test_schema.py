"""The typed config schema: every shipped config validates; bad ones fail before any work, naming the key."""

import sys
import typing
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from captioning import evaluate, train
from captioning.metrics import VALID_METRICS
from captioning.config_check import registry
from captioning.schema import (AttentionConfig, ConfigError, EncoderConfig, OptimConfig, SchedulerConfig,
                               validate_evaluate_config, validate_train_config)

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ("dataset", "encoder", "attention", "decoder", "optim", "scheduler", "eval")


def _compose(*overrides, name="train"):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.fixture
def real_files(tmp_path):
    """An annotation file and an image folder, so data sets other than the generated `shapes` pass the path
    checks (dataset.format=coco reads the two caption files instead)."""
    (tmp_path / "images").mkdir()
    for name in ("split.json", "train_captions.json", "val_captions.json"):
        (tmp_path / name).write_text("{}")
    return [f"dataset.annotations={tmp_path / 'split.json'}", f"dataset.image_root={tmp_path / 'images'}"]


def _entries(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_entry_validates(group, real_files):
    for entry in _entries(group):
        validate_train_config(_compose(f"{group}={entry}", *real_files))


@pytest.mark.parametrize("preset", _entries("experiment"))
def test_every_preset_validates(preset, real_files):
    validate_train_config(_compose(f"experiment={preset}", *real_files))


def test_coco_format_checks_the_caption_files(tmp_path, real_files):
    files = [f"dataset.coco.train_captions={tmp_path / 'train_captions.json'}",
             f"dataset.coco.val_captions={tmp_path / 'val_captions.json'}", f"dataset.image_root={tmp_path}"]
    validate_train_config(_compose("dataset=coco", "dataset.format=coco", *files))
    with pytest.raises(ConfigError) as err:
        validate_train_config(_compose("dataset=coco", "dataset.format=coco", *files[1:]))
    assert "dataset.coco.train_captions='data/coco/annotations/captions_train2014.json': file not found" in str(err.value)


def test_schema_covers_every_target_in_conf():
    registries = {"encoder": EncoderConfig, "attention": AttentionConfig, "optim": OptimConfig,
                  "scheduler": SchedulerConfig}
    for group, base in registries.items():
        targets = {(yaml.safe_load((CONF / group / f"{e}.yaml").read_text()) or {}).get("_target_")
                   for e in _entries(group)} - {None}
        assert targets and targets <= set(registry(base)), group


def test_schema_lists_match_the_code():
    from captioning.data.build import FORMATS
    from captioning.models.attention import HardAttention
    from captioning.schema import METRICS, MONITORS, DatasetConfig, HardAttentionConfig

    assert MONITORS == train.MONITORS and set(METRICS) == set(VALID_METRICS)
    assert typing.get_args(typing.get_type_hints(DatasetConfig)["format"]) == FORMATS
    assert typing.get_args(typing.get_type_hints(HardAttentionConfig)["test_mode"]) == HardAttention.TEST_MODES


BAD = [  # (overrides, the message line that must appear)
    (["optim.lr=-0.1"], "optim.lr=-0.1: must be > 0"),
    (["eval.beam_size=0"], "eval.beam_size=0: must be >= 1"),
    (["trainer.val_beam_size=0"], "trainer.val_beam_size=0: must be >= 1"),
    (["decoder.dropout=1.0"], "decoder.dropout=1.0: must be < 1"),
    (["dataset.batch_size=0"], "dataset.batch_size=0: must be >= 1"),
    (["attention=hard", "attention.expected_context_prob=1.5"], "attention.expected_context_prob=1.5: must be <= 1"),
    (["attention=hard", "attention.test_mode=argmx"],
     "attention.test_mode='argmx': choose one of expectation, argmax, sample (did you mean 'argmax'?)"),
    (["attention._target_=captioning.models.attention.SoftAtention"],
     "attention: unknown type 'captioning.models.attention.SoftAtention'; choose one of SoftAttention, "),
    (["encoder=vgg16", "encoder.arch=vgg17"], "encoder.arch='vgg17': choose one of vgg11, "),
    (["encoder=resnet50", "encoder.fine_tune=last"], "encoder.fine_tune='last': choose one of none, top, all"),
    (["trainer.monitor=cider"], "trainer.monitor='cider' is not computed during validation; choose one of "),
    (["device=gpu"], "device='gpu': must be auto, cpu, mps, cuda or cuda:N"),
    (["eval.metrics=[bleu,cidre]"], "eval.metrics[1]='cidre': choose one of bleu, meteor, rouge, cider, spice"),
    (["seed=abc"], "seed='abc': must be an integer"),
    (["+optim.lrr=0.1"], "optim.lrr: unknown key (did you mean 'lr'?)"),
    (["scheduler.mode=min"], "scheduler.mode='min': must be 'max'"),
    (["resume=no/such/last.pt"], "resume='no/such/last.pt': checkpoint not found"),
    (["dataset=flickr8k", "data_dir=nowhere", f"dataset.image_root={CONF}"],
     "dataset.annotations='nowhere/flickr8k/dataset_flickr8k.json': file not found; set dataset.annotations=PATH"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[o[-1].split("=")[0] for o, _ in BAD])
def test_invalid_config_is_rejected_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate_train_config(_compose(*overrides))
    assert message in str(err.value)
    assert len(err.value.problems) == 1  # nothing else is reported


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        validate_train_config(_compose("optim.lr=0", "eval.beam_size=0", "decoder.embed_dim=-3"))
    assert [key for key, _ in err.value.problems] == ["decoder.embed_dim", "optim.lr", "eval.beam_size"]
    assert str(err.value).startswith("invalid configuration (3 problems):\n  decoder.embed_dim=-3: must be >= 1")


def test_a_typo_in_a_preset_file_is_caught():
    # Hydra merges new keys from YAML files without complaint; the schema does not.
    cfg = _compose()
    OmegaConf.set_struct(cfg, False)
    cfg.decoder.dropuot = 0.3
    cfg.trainer.max_epoch = 3
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    assert {p[0] for p in err.value.problems} == {"decoder.dropuot", "trainer.max_epoch"}
    assert "did you mean 'dropout'?" in str(err.value) and "did you mean 'max_epochs'?" in str(err.value)


def test_missing_and_unresolvable_values():
    cfg = _compose()
    OmegaConf.set_struct(cfg, False)
    del cfg.trainer["patience"]
    with pytest.raises(ConfigError, match=r"trainer.patience: missing; this key is required"):
        validate_train_config(cfg)
    with pytest.raises(ConfigError, match=r"data_dir: cannot resolve"):
        validate_train_config(_compose("data_dir=${oc.env:CAPTIONING_TEST_UNSET_VARIABLE}"))


def test_evaluate_config(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint: missing value \(\?\?\?\); set it on the command line"):
        validate_evaluate_config(_compose(name="evaluate"))
    with pytest.raises(ConfigError, match="checkpoint='nope.pt': checkpoint not found"):
        validate_evaluate_config(_compose("checkpoint=nope.pt", name="evaluate"))
    (tmp_path / "best.pt").write_bytes(b"")
    validate_evaluate_config(_compose(f"checkpoint={tmp_path / 'best.pt'}", name="evaluate"))
    with pytest.raises(ConfigError, match="eval.instances='none.json': file not found"):
        validate_evaluate_config(_compose(f"checkpoint={tmp_path / 'best.pt'}", "eval.instances=none.json",
                                          name="evaluate"))


# -- through the real console entry points: the error is printed and nothing is created or read ----------
def _run_app(module, args, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [module.__name__, *args, f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    return exit_.value.code


def test_train_entry_point_fails_before_any_work(monkeypatch, tmp_path, capsys):
    code = _run_app(train, ["optim.lr=-0.1", "+decoder.dropuot=0.2", f"data_dir={tmp_path / 'data'}"],
                    monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert code == 1 and "optim.lr=-0.1: must be > 0" in err and "decoder.dropuot: unknown key (did you mean" in err
    assert not (tmp_path / "data").exists()  # shapes was not generated
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "config.yaml").exists()


def test_unknown_group_choice_is_reported_by_hydra(monkeypatch, tmp_path, capsys):
    assert _run_app(train, ["attention=sofft"], monkeypatch, tmp_path) == 1
    err = capsys.readouterr().err
    assert "Could not find 'attention/sofft'" in err and "Available options in 'attention'" in err
    assert all(f"\t{choice}\n" in err for choice in _entries("attention"))


def test_evaluate_entry_point_fails_before_loading(monkeypatch, tmp_path, capsys):
    assert _run_app(evaluate, ["checkpoint=missing.pt", "eval.beam_size=0"], monkeypatch, tmp_path) == 1
    err = capsys.readouterr().err
    assert "checkpoint='missing.pt': checkpoint not found" in err and "eval.beam_size=0: must be >= 1" in err


def test_keys_of_the_shipped_yaml_files_are_accepted(monkeypatch, tmp_path):
    # A key another module adds to conf/dataset/*.yaml (or trainer in train.yaml) validates before the schema
    # learns its type; the same key in a user's override is still a typo.
    import captioning.schema as schema

    conf = tmp_path / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset" / "mine.yaml").write_text("name: mine\nshards: 4\n")
    (conf / "train.yaml").write_text("trainer:\n  ema_decay: 0.999\n")
    monkeypatch.setattr(schema, "CONF_DIR", conf)
    cfg = _compose()
    OmegaConf.set_struct(cfg, False)
    cfg.dataset.shards, cfg.trainer.ema_decay, cfg.eval.shards = 4, 0.999, 4
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    assert [key for key, _ in err.value.problems] == ["eval.shards"]
