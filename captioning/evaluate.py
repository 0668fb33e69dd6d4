"""Decode a split and score it as coco-caption does: `captioning-evaluate checkpoint=PATH [overrides]`.

`checkpoint=[a.pt,b.pt,...]` evaluates a test-time ensemble (captioning/models/ensemble.py): the models decode
together in the one beam search with the mean of their word probabilities (`ensemble.mean=prob`) or of their
log-probabilities (`ensemble.mean=logprob`), from the images (each model through its own encoder), on the first
checkpoint's data set, with the attention maps of model `ensemble.maps_from`; metrics.json names the checkpoints.

At module level only Hydra and the light helpers are imported: torch and the models load when the evaluation
starts, so `--help`, a misspelt override or a checkpoint that is missing or no checkpoint answer at once."""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf

from captioning.base.constraints import choose_one
from captioning.base.lock import LOCK_NAME, FolderLock
from captioning.checkpoint import check_checkpoint_file
from captioning.cli import fail, no_unused_folder, run_cli
from captioning.config.help import HELP_FLAGS, bare_help
from captioning.config.overrides import check_overrides
from captioning.runtime import CONF_DIR

PROG = "captioning-evaluate"
logger = logging.getLogger(__name__)


def checkpoint_list(checkpoint: Any) -> list[str]:
    """The checkpoints `checkpoint=` names: one path, or a list of them (an ensemble)."""
    if isinstance(checkpoint, (list, tuple, ListConfig)):
        return [str(p) for p in checkpoint]
    return [str(checkpoint)]


def eval_dir(checkpoint: str | Sequence[str], split: str, beam_size: int, mean: str = "") -> str:
    """Where an evaluation writes by default: next to the checkpoint's run, <run>/eval/<split>-beam<K>-<name>
    (a checkpoint outside a run's checkpoints/ folder: <its folder>/eval/...). An ensemble of N checkpoints writes
    next to the first one's run, <split>-beam<K>-ensemble<N>-<mean>-<8 hex digits of its checkpoints' paths>."""
    paths = [Path(p).absolute() for p in checkpoint_list(checkpoint)] or [Path("none")]
    run = paths[0].parent.parent if paths[0].parent.name == "checkpoints" else paths[0].parent
    if len(paths) == 1:
        return str(run / "eval" / f"{split}-beam{beam_size}-{paths[0].stem}")
    digest = hashlib.sha256("\n".join(map(str, paths)).encode()).hexdigest()[:8]
    return str(run / "eval" / f"{split}-beam{beam_size}-ensemble{len(paths)}-{mean}-{digest}")


OmegaConf.register_new_resolver("eval_dir", eval_dir, replace=True)  # used by conf/evaluate.yaml's hydra.run.dir


def validate_evaluate_config(cfg: DictConfig) -> None:
    """The config checked (captioning.config: a typo, bad value or missing checkpoint, naming the key), then its
    checkpoint refused if it is no checkpoint file, all before torch loads (an evaluate config has no `_target_`
    group to check against the models, unless it names a dataset)."""
    from captioning.config import validate_evaluate_config as validate
    from captioning.config.schema import DatasetConfig

    changes = dataset_changes(cfg)
    if changes is not None:  # keys of the checkpoint's data set (dataset.features=...): checked by name here
        known = list(DatasetConfig.__annotations__)
        for key in map(str, changes):
            if key not in known:
                raise ValueError(f"dataset.{key} is not a data set key: {choose_one(key, known)}")
        cfg = OmegaConf.create({k: v for k, v in cfg.items() if k != "dataset"})
    validate(cfg)
    for path in checkpoint_list(cfg.checkpoint):
        check_checkpoint_file(path)


def dataset_changes(cfg: DictConfig) -> DictConfig | None:
    """The `dataset.KEY=VALUE` overrides of a run without `dataset=NAME`: changes to the checkpoint's data set
    (e.g. dataset.features, dataset.num_workers); None when the config names a data set of its own or none."""
    given = cfg.get("dataset")
    return given if given is not None and "reader" not in given and "name" not in given else None


def evaluate(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Load a checkpoint, decode a split of its data set and write the scores; returns the metrics."""
    from captioning.evaluation.split import EvalSettings, evaluate_split, load_instances
    from captioning.factory.datasets import build_datasets
    from captioning.factory.load import load_ensemble
    from captioning.features.cache import open_features
    from captioning.models.captioner import compile_decoding, select_attention_map
    from captioning.models.ensemble import members_of
    from captioning.runtime import resolve_device

    validate_evaluate_config(cfg)  # a typo, bad value or missing checkpoint fails here, naming the key
    device = resolve_device(cfg.device)
    ev = EvalSettings.of(cfg.eval)
    paths = checkpoint_list(cfg.checkpoint)
    model, vocab, ckpt = load_ensemble(paths, device, cfg.ensemble.mean, int(cfg.ensemble.maps_from))
    for member in members_of(model):
        compile_decoding(member, ev.compile)
    select_attention_map(model, ev.attention_layer, ev.attention_head)  # an ensemble: of model ensemble.maps_from
    train_cfg = OmegaConf.create(ckpt["config"])
    changes = dataset_changes(cfg)
    own = cfg.get("dataset") is not None and changes is None  # dataset=NAME: another data set
    dataset_cfg = cfg.dataset if own else cast(DictConfig, OmegaConf.merge(train_cfg.dataset, changes or {}))
    ensemble = len(members_of(model)) > 1
    if ensemble:
        dataset_cfg = from_images(dataset_cfg)
    features = open_features(dataset_cfg.get("features"), model.encoder, ckpt["config"]["model"]["encoder"],
                             dataset_cfg.get("boxes"))
    with FolderLock(out_dir, "evaluation"):  # one evaluation writes into a folder at a time
        # A dataset section taken from the checkpoint writes nothing but a generated data set under data_dir.
        within = None if own else Path(cfg.data_dir)
        _, data = build_datasets(dataset_cfg, model.encoder.transform(), splits=[cfg.eval.split], vocab=vocab,
                                 features=features, checkpoint_data=within)
        instances = load_instances(ev.instances, data[ev.split])  # a wrong file fails before the long decode
        before = {"checkpoints": [str(Path(p).absolute()) for p in paths], "ensemble_mean": cfg.ensemble.mean,
                  "ensemble_maps_from": int(cfg.ensemble.maps_from)} if ensemble else None
        metrics = evaluate_split(model, data[ev.split], ev, out_dir, instances, before=before)
    assert metrics is not None  # one process decodes and scores the whole split
    return metrics


def from_images(dataset_cfg: DictConfig) -> DictConfig:
    """An ensemble's data set section: its images, never a feature cache (which holds one encoder's annotations,
    while each model of an ensemble encodes the images with its own encoder)."""
    if not dataset_cfg.get("features"):
        return dataset_cfg
    root = dataset_cfg.get("image_root")
    if not root or not Path(str(root)).is_dir():
        raise ValueError(f"an ensemble decodes from the images (each model through its own encoder), not from the "
                         f"feature cache dataset.features={dataset_cfg.features}, but dataset.image_root={root} is "
                         "no folder: give the data set with its images (dataset=NAME dataset.image_root=DIR)")
    logger.info("an ensemble decodes from the images in %s: the feature cache %s (one encoder's annotations) is "
                "not read", root, dataset_cfg.features)
    return OmegaConf.create({**cast(dict, OmegaConf.to_container(dataset_cfg, resolve=True)), "features": None})


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="evaluate")
def hydra_main(cfg: DictConfig) -> None:
    """The Hydra app; a bad config or file is one `error:` line on stderr and exit status 2, and leaves no empty
    output folder."""
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    with no_unused_folder(out_dir, (".hydra", LOCK_NAME)):
        metrics = run_cli(lambda: evaluate(cfg, out_dir), PROG)
    print(json.dumps(metrics, indent=2))


def checkpoint_dataset_keys(args: list[str]) -> list[str]:
    """Without `dataset=NAME`, `dataset.KEY=VALUE` changes the checkpoint's data set: Hydra adds the key (+)."""
    if any(a.lstrip("+~").startswith("dataset=") for a in args):
        return args
    return [f"+{a}" if a.startswith("dataset.") and "=" in a else a for a in args]


def main() -> None:
    """Console entry point `captioning-evaluate checkpoint=PATH [overrides]`."""
    if (text := bare_help(sys.argv[1:], CONF_DIR, "evaluate")) is not None:  # Hydra's text, without composing
        print(text)
        return
    sys.argv[1:] = args = checkpoint_dataset_keys(sys.argv[1:])
    asks_help = bool({*HELP_FLAGS, "--hydra-help"} & set(args))
    if not any(a.lstrip("+").startswith("checkpoint=") for a in args) and not asks_help:
        fail(PROG, "give checkpoint=PATH (a best.pt or last.pt of captioning-train), or checkpoint=[A,B,...] for an "
             "ensemble; see captioning-evaluate --help")
    # typos, bad values, a missing checkpoint: one line, before Hydra makes the output folder
    run_cli(lambda: check_overrides(args, CONF_DIR, "evaluate", validate_evaluate_config), PROG)
    hydra_main()


if __name__ == "__main__":
    main()
