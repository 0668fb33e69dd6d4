"""Typos on the command line are one line with a did-you-mean, before Hydra starts (captioning/config/overrides.py)."""

from __future__ import annotations

import pytest

from captioning.config.overrides import OverrideError, check_overrides
from captioning.runtime import CONF_DIR


@pytest.mark.parametrize("args, message", [
    (["atention=hard"], "atention=hard: unknown config group or key (did you mean 'attention'?)"),
    (["attention=sofft"], "attention=sofft: no such choice in attention/ (choose one of channel, concat, dot, general, "
                          "hard, local, location, mean, monotonic, multihead, multilevel, multirep, soft; did you mean 'soft'?)"),
    (["-m", "attention=soft,hardd"], "attention=soft,hardd: no such choice in attention/"),
    (["decoder.dropuot=0.2"], "decoder.dropuot=0.2: unknown key (did you mean 'dropout'?) (to add a new key, write "
                              "+decoder.dropuot=0.2)"),
    (["attention=soft", "attention.expected_context_prob=0.5"], "attention.expected_context_prob=0.5: unknown key"),
    (["trainer.max_epoch=3"], "did you mean 'max_epochs'?"),
    (["sed=1"], "sed=1: unknown config group or key (did you mean 'seed'?)"),
])
def test_typos_are_named_with_a_suggestion(args, message):
    with pytest.raises(OverrideError) as err:
        check_overrides(args, CONF_DIR, "train")
    assert message in str(err.value)


@pytest.mark.parametrize("args", [
    [], ["attention=hard", "attention.expected_context_prob=0.75"], ["-m", "attention=soft,hard", "optim.lr=1e-3,2e-3"],
    ["+decoder.new_key=1"], ["hydra.run.dir=outputs/x", "hydra/launcher=joblib"], ["experiment=coco_soft"],
    ["trainer.max_epochs=-1"],  # a bad value is the schema's to report, after composition
    ["decoder=luong", "decoder.input_feeding=false"], ["scheduler=none"],
    ["dataset=table", "dataset.annotations=c.csv", "dataset.image_root=photos"],  # keys the data set leaves open (???)
])
def test_valid_overrides_pass(args):
    check_overrides(args, CONF_DIR, "train")


def test_evaluate_overrides():
    check_overrides(["checkpoint=x.pt", "eval.beam_size=5"], CONF_DIR, "evaluate")
    with pytest.raises(OverrideError, match="did you mean 'beam_size'"):
        check_overrides(["checkpoint=x.pt", "eval.beam_sise=5"], CONF_DIR, "evaluate")


# A user's own config folder (hydra.searchpath=[file://...]): its groups and options count as conf/'s.
OWN_PRESET = """\
# @package _global_
defaults:
  - override /decoder: updown
trainer:
  patience: 3
"""


@pytest.fixture
def own_conf(tmp_path, monkeypatch):
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "mine.yaml").write_text(OWN_PRESET)
    (tmp_path / "my_conf" / "optim").mkdir()
    (tmp_path / "my_conf" / "optim" / "my_adam.yaml").write_text("_target_: torch.optim.Adam\n_partial_: true\n"
                                                                 "lr: 0.001\n")
    monkeypatch.chdir(tmp_path)  # file://my_conf is read from the current folder, as Hydra reads it
    return tmp_path / "my_conf"


def test_an_own_config_folder_adds_presets_and_options(own_conf):
    from captioning.train import validate_train_config

    for folder in ("file://my_conf", f"file://{own_conf}"):
        check_overrides([f"hydra.searchpath=[{folder}]", "experiment=mine", "optim=my_adam"], CONF_DIR, "train",
                        validate_train_config)
    with pytest.raises(OverrideError, match=r"choose one of .*coco_updown_scst.*, mine; did you mean 'mine'\?"):
        check_overrides(["hydra.searchpath=[file://my_conf]", "experiment=mien"], CONF_DIR, "train")
    with pytest.raises(OverrideError, match=r"experiment=mine: no such choice in experiment/"):
        check_overrides(["experiment=mine"], CONF_DIR, "train")  # without the folder, an unknown preset
    with pytest.raises(OverrideError) as err:
        check_overrides(["hydra.searchpath=[file://my_cnof]", "experiment=mine"], CONF_DIR, "train")
    assert str(err.value) == (f"hydra.searchpath=[file://my_cnof]: no folder {own_conf.parent / 'my_cnof'} (a config "
                              "folder to search: give its path after file://, absolute or from the current folder)")


def test_what_an_own_preset_selects_is_logged_with_its_path(own_conf):
    from hydra import compose, initialize_config_dir

    from captioning.config.choices import implied_choices

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra.searchpath=[file://my_conf]", "experiment=mine"],
                      return_hydra_config=True)
    assert cfg.decoder._target_ == "updown" and cfg.trainer.patience == 3
    lines = implied_choices(cfg.hydra.runtime.choices, [CONF_DIR, own_conf], {"experiment"})
    assert lines == [f"experiment=mine selects decoder=updown ({own_conf / 'experiment' / 'mine.yaml'})"]
    assert implied_choices(cfg.hydra.runtime.choices, [CONF_DIR], {"experiment"}) == []  # its file not searched


def test_an_item_of_a_list_is_named_by_its_index():
    """encoder=multi's encoders: `encoder.encoders.1.channels=...` sets the second encoder's argument (Hydra's
    syntax); a misspelt key inside an item, or an index past the list's end, is refused in one line."""
    check_overrides(["encoder=multi", "encoder.encoders.1.channels=[8,16,32]"], CONF_DIR, "train")
    with pytest.raises(OverrideError, match=r"^encoder\.encoders\.1\.chanels=\[8\]: unknown key \(did you mean "
                                            r"'channels'\?\)"):
        check_overrides(["encoder=multi", "encoder.encoders.1.chanels=[8]"], CONF_DIR, "train")
    with pytest.raises(OverrideError, match=r"^encoder\.encoders\.2\.channels=\[8\]: unknown key"):
        check_overrides(["encoder=multi", "encoder.encoders.2.channels=[8]"], CONF_DIR, "train")
