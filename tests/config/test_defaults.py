"""One default per fact: a component built from Python with no arguments is the component its config file builds.

Every `_target_` a conf/ group file names (encoder, attention, decoder, objective, dataset.generate, dataset.reader)
has, for each key the file sets, either no default in its signature or exactly the file's value. Where the files
that name one target disagree (VGG's `arch` in vgg16.yaml and vgg19.yaml), the choice is the file's and the default
must be one of them."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import yaml
from family import refusal
from fixtures import TINY_MODEL, compose_config
from omegaconf import OmegaConf

from captioning.checkpoint.moved import MOVED_KEYS, moved_override, upgrade_config
from captioning.config import targets
from captioning.factory import registry
from captioning.factory.models import build_captioner, model_config
from captioning.runtime import CONF_DIR

GROUP_FILES = [p for p in sorted(CONF_DIR.rglob("*.yaml")) if p.relative_to(CONF_DIR).parts[0] not in
               ("hydra", "experiment") and p.parent != CONF_DIR]


def _targets(node: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(target, its keys) of every `_target_` mapping in a YAML tree."""
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((node["_target_"], {k: v for k, v in node.items() if not k.startswith("_")}))
        for key, value in node.items():
            found += _targets(value, f"{where}.{key}")
    return found


def _callable(target: str):
    for table in (*registry.GROUPS.values(), *targets.OWN_CLASSES.values()):  # and the project's own schedules
        if target in table:
            return table[target]
    return None


def _uses() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """target -> (file, keys) of each group file that names it; a file's `defaults` parts merged in first."""
    uses: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path in GROUP_FILES:
        data = yaml.safe_load(path.read_text()) or {}
        for part in data.get("defaults", []) if isinstance(data, dict) else []:  # objective/_terms.yaml
            if isinstance(part, str) and part != "_self_" and not part.startswith("override"):
                data = {**(yaml.safe_load((path.parent / f"{part.split('@')[0]}.yaml").read_text()) or {}), **data}
        for target, keys in _targets(data, path.stem):
            uses.setdefault(target, []).append((str(path.relative_to(CONF_DIR)), keys))
    return uses


USES = _uses()


def test_every_group_target_is_registered():
    assert USES and all(_callable(t) is not None for t in USES if not t.startswith("torch.")), sorted(USES)
    assert {"xe", "scst"} <= set(USES)


@pytest.mark.parametrize("target", sorted(t for t in USES if not t.startswith("torch.")))
def test_signature_defaults_are_the_config_values(target):
    fn = _callable(target)
    wrong = []
    for name, param in inspect.signature(fn).parameters.items():
        values = [keys[name] for _, keys in USES[target] if name in keys]
        if param.default is inspect.Parameter.empty or not values:
            continue
        values = [v for v in values if not (isinstance(v, str) and "${" in v)]  # interpolations: set by the config
        default = list(param.default) if isinstance(param.default, tuple) else param.default
        if values and default not in values:  # one value: it; several (a choice per file): one of them
            wrong.append(f"{name}: default {param.default!r}, config {values}")
    assert not wrong, f"{target}: {wrong}"


def _shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


@pytest.mark.parametrize(("attention", "decoder"), [
    (a.stem, d.stem) for a in sorted((CONF_DIR / "attention").glob("*.yaml"))
    for d in sorted((CONF_DIR / "decoder").glob("*.yaml"))
    if refusal(d.stem, a.stem) is None])  # a refused pair: tests/models/test_decoders.py
def test_python_with_no_arguments_builds_the_configs_model(attention, decoder):
    """`SoftAttention(D, n)` and `attention=soft` are one model; so are `ShowAttendTellDecoder(V, D, att)` and
    `decoder=sat`: the same parameters, of the same shapes."""
    cfg = compose_config(f"attention={attention}", f"decoder={decoder}")
    att_cls, dec_cls = _callable(cfg.attention._target_), _callable(cfg.decoder._target_)
    torch.manual_seed(0)
    from_config = build_captioner(model_config(cfg), 30).decoder  # what the command line builds (small_cnn grids)
    from_python = dec_cls(30, build_captioner(model_config(cfg), 30).encoder.out_dim, att_cls)
    assert _shapes(from_python) == _shapes(from_config)
    assert {k: v for k, v in vars(from_python).items() if not k.startswith("_") and not isinstance(v, torch.nn.Module)
            } == {k: v for k, v in vars(from_config).items() if not k.startswith("_")
                  and not isinstance(v, torch.nn.Module)}


@pytest.mark.parametrize("objective", ["xe", "scst"])
def test_the_objective_from_python_is_the_configs(objective):
    cfg = compose_config(f"objective={objective}")
    built = registry.build("objective", OmegaConf.to_container(cfg.objective))
    plain = type(built)()
    assert vars(plain) == vars(built)
    assert built.attention_weight == 0.0 and built.baseline_decay == 0.9  # conf/objective/_terms.yaml, shared


def test_the_shared_terms_file_is_no_choice_of_its_own():
    from captioning.config.overrides import OverrideError, check_overrides
    with pytest.raises(OverrideError, match=r"objective=_terms: no such choice in objective/ \(choose one of scst, xe"):
        check_overrides(["objective=_terms"], CONF_DIR, "train")


# -- keys that moved -----------------------------------------------------------------------------------------------
def test_moved_overrides_are_renamed_with_their_prefix_and_value():
    assert moved_override("trainer.attention_weight=1.0") == "objective.attention_weight=1.0"
    assert moved_override("trainer.reinforce.reward=token_mean") == "objective.reward=token_mean"
    assert moved_override("trainer.attention_weight=0,0.1,1") == "objective.attention_weight=0,0.1,1"  # a sweep
    assert moved_override("++trainer.reinforce.every_batch=true") == "++objective.every_batch=true"
    assert moved_override("trainer.max_epochs=3") is None and moved_override("attention=hard") is None
    cfg = compose_config()
    for new in MOVED_KEYS.values():  # every new key exists in the default config
        assert OmegaConf.select(cfg, new) is not None, new


def test_the_train_command_line_renames_moved_keys_and_says_so(capsys):
    from captioning.train import rename_moved
    argv = ["attention=hard", "trainer.attention_weight=1.0", "trainer.reinforce.num_samples=2"]
    assert rename_moved(argv) == ["attention=hard", "objective.attention_weight=1.0", "objective.num_samples=2"]
    err = capsys.readouterr().err
    assert "note: trainer.attention_weight is now objective.attention_weight" in err
    assert err.count("\n") == 2


def _old_layout(config: dict[str, Any], objective: str = "CrossEntropy") -> dict[str, Any]:
    """A config as runs stored it before the loss settings moved to the objective."""
    old = {**config, "trainer": {**config["trainer"], "attention_weight": 1.0, "attention_reduction": "caption_mean",
                                 "reinforce": {"reward_weight": 0.2, "entropy_weight": 0.01, "baseline_decay": 0.8,
                                               "num_samples": 2, "reward": "token_mean", "reduction": "sum",
                                               "doubly_stochastic": False, "every_batch": True}},
           "objective": {"_target_": f"captioning.training.objectives.{objective}"}}
    return old


def test_an_old_config_is_upgraded_once_and_a_new_one_is_left_alone():
    config = OmegaConf.to_container(compose_config(), resolve=True)
    assert upgrade_config(config) is config
    up = upgrade_config(_old_layout(config))
    assert "reinforce" not in up["trainer"] and "attention_weight" not in up["trainer"]
    assert registry.build("objective", up["objective"]).every_batch is True  # builds, with the old values
    assert up["objective"]["attention_weight"] == 1.0 and up["objective"]["num_samples"] == 2
    scst = upgrade_config(_old_layout(config, "SelfCritical"))["objective"]
    assert scst["entropy_weight"] == 0.01 and "num_samples" not in scst  # SCST never used the cross-entropy keys
    registry.build("objective", scst)


def test_a_checkpoint_written_before_the_move_still_loads(tiny_model, tmp_path):
    from captioning.checkpoint import save_checkpoint
    from captioning.data.vocab import Vocabulary
    from captioning.factory.load import load_model
    vocab = Vocabulary.build([[f"w{i}" for i in range(12 - 4)]])  # 12 ids with the 4 special tokens
    config = {**OmegaConf.to_container(compose_config(), resolve=True), "model": TINY_MODEL}
    old = save_checkpoint(tmp_path / "old.pt", tiny_model, vocab, _old_layout(config))
    model, loaded_vocab, loaded = load_model(old)
    assert loaded_vocab == vocab
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), tiny_model.state_dict().values()))
    assert loaded["config"]["objective"]["reward"] == "token_mean" and "reinforce" not in loaded["config"]["trainer"]
