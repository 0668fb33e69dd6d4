"""factory/run.py: a training run's parts built from its config, and the Trainer that receives them."""

from __future__ import annotations

import pytest
from fixtures import compose_config, compose_tiny_train

from captioning.checkpoint import same_model
from captioning.evaluation.split import EvalSettings
from captioning.factory.models import model_config
from captioning.factory.registry import with_added_defaults
from captioning.factory.run import build_run, build_trainer, stored_config
from captioning.runtime import set_seed
from captioning.training.objectives import CrossEntropy, SelfCritical
from captioning.training.parts import LoaderSettings


def test_the_eval_settings_defaults_are_the_configs():
    cfg = compose_config()
    assert EvalSettings.of(cfg.eval) == EvalSettings.shipped()  # one default per fact: conf/eval/default.yaml's
    assert LoaderSettings.of(cfg.dataset) == LoaderSettings(32, "images", None, 0)  # conf/dataset/shapes.yaml's


def test_build_run_gives_the_trainer_every_part(shapes_json, tmp_path):
    cfg = compose_tiny_train(shapes_json, "device=cpu", "eval.beam_size=2", "dataset.batch_size=6")
    set_seed(cfg.seed)
    parts = build_run(cfg)
    assert set(parts.data) == {"train", "val", "test"} and len(parts.data["train"]) == 48
    assert isinstance(parts.objective, CrossEntropy) and parts.scheduler is not None
    assert parts.eval.beam_size == 2 and parts.eval.metrics == ("bleu", "cider") and parts.loader.batch_size == 6
    assert parts.config == stored_config(cfg) and parts.config["model"] == model_config(cfg)
    assert parts.run_info == {"attention": "soft", "dataset": "shapes"}  # outside Hydra: the registered name
    assert len(parts.vocab) == parts.model.decoder.vocab_size
    assert [p.data_ptr() for g in parts.optimizer.param_groups for p in g["params"]] == \
        [p.data_ptr() for p in parts.model.parameters() if p.requires_grad]
    trainer = build_trainer(cfg, tmp_path)
    assert trainer.config_dict() == parts.config and trainer.model.decoder.vocab_size == len(parts.vocab)


def test_the_same_seed_builds_the_same_model(shapes_json):
    cfg = compose_tiny_train(shapes_json, "device=cpu")
    weights = []
    for _ in range(2):
        set_seed(cfg.seed)
        weights.append(build_run(cfg).model.state_dict())
    assert all((weights[0][k] == weights[1][k]).all() for k in weights[0])


def test_objective_scst_builds_the_self_critical_objective(shapes_json):
    parts = build_run(compose_tiny_train(shapes_json, "device=cpu", "objective=scst"))
    assert isinstance(parts.objective, SelfCritical) and parts.scheduler is None  # scst.yaml: a constant step


@pytest.mark.parametrize(("decoder", "added"), [("adaptive", {"sentinel": True}),
                                                 ("transformer", {"memory_slots": 0, "mesh": False})])
def test_a_checkpoint_from_before_a_models_new_argument_resumes(decoder, added):
    """resume and init_from read a stored model config without an argument added since as having its default (what
    loading builds); a run that sets it otherwise is another model."""
    run = model_config(compose_config(f"decoder={decoder}"))
    stored = {**run, "decoder": {k: v for k, v in run["decoder"].items() if k not in added}}
    assert {k: run["decoder"][k] for k in added} == added
    ckpt = {"config": {"model": stored}}
    same_model(ckpt, "old.pt", run, None, "resume", "", upgrade=with_added_defaults)
    with pytest.raises(ValueError, match="cannot resume old.pt: it was trained with a different model config"):
        same_model(ckpt, "old.pt", run, None, "resume", "")  # read as written, it is not the run's
    key = next(iter(added))
    other = {**run, "decoder": {**run["decoder"], key: not added[key] if isinstance(added[key], bool) else 4}}
    with pytest.raises(ValueError, match="different model config"):
        same_model(ckpt, "old.pt", other, None, "resume", "", upgrade=with_added_defaults)
