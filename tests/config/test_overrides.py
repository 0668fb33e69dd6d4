"""Typos on the command line are one line with a did-you-mean, before Hydra starts (captioning/config/overrides.py)."""

from __future__ import annotations

import pytest

from captioning.config.overrides import OverrideError, check_overrides
from captioning.runtime import CONF_DIR


@pytest.mark.parametrize("args, message", [
    (["atention=hard"], "atention=hard: unknown config group or key (did you mean 'attention'?)"),
    (["attention=sofft"], "attention=sofft: no such choice in attention/ (choose one of concat, dot, general, hard, "
                          "local, location, multihead, soft; did you mean 'soft'?)"),
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
])
def test_valid_overrides_pass(args):
    check_overrides(args, CONF_DIR, "train")


def test_evaluate_overrides():
    check_overrides(["checkpoint=x.pt", "eval.beam_size=5"], CONF_DIR, "evaluate")
    with pytest.raises(OverrideError, match="did you mean 'beam_size'"):
        check_overrides(["checkpoint=x.pt", "eval.beam_sise=5"], CONF_DIR, "evaluate")
