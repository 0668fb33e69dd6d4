"""Config keys and names that moved, mapped once: a command line, a sweep or a checkpoint written before the move
still works.

Components were named by import path (`_target_: captioning.models.decoder.ShowAttendTellDecoder`); they are named
by the name they are registered under (`_target_: sat`, captioning/factory/registry.py). `NAMED` maps every old
path to its name; a checkpoint's stored config is read with its targets renamed.

The loss settings were `trainer.attention_weight`, `trainer.attention_reduction` and `trainer.reinforce.*`; they are
now arguments of the objective (conf/objective/_terms.yaml, xe.yaml, scst.yaml): `objective.attention_weight`, ...
`captioning-train` renames such an override before Hydra sees it (and says so); a checkpoint's stored config is
read with its keys moved (captioning/factory/load.py).
"""

from __future__ import annotations

import copy
from typing import Any

# Used by both objectives (conf/objective/_terms.yaml); the other REINFORCE keys are cross-entropy's only.
SHARED_TERMS = ("attention_weight", "attention_reduction", "doubly_stochastic", "entropy_weight", "baseline_decay")
_REINFORCE = ("reward_weight", "entropy_weight", "baseline_decay", "num_samples", "reward", "reduction",
              "doubly_stochastic", "every_batch")
# Every `_target_` import path a config or checkpoint could name before components had names, and the name now.
NAMED: dict[str, str] = {
    "captioning.models.encoder.SmallCNN": "small_cnn",
    "captioning.models.encoder.VGGEncoder": "vgg",
    "captioning.models.encoder.ResNetEncoder": "resnet",
    "captioning.models.attention.SoftAttention": "soft",
    "captioning.models.attention.HardAttention": "hard",
    "captioning.models.attention_family.ConcatAttention": "concat",
    "captioning.models.attention_family.DotAttention": "dot",
    "captioning.models.attention_family.GeneralAttention": "general",
    "captioning.models.attention_family.LocalAttention": "local",
    "captioning.models.attention_family.LocationAttention": "location",
    "captioning.models.attention_family.MultiHeadAttention": "multihead",
    "captioning.models.decoder.ShowAttendTellDecoder": "sat",
    "captioning.models.luong_decoder.LuongDecoder": "luong",
    "captioning.models.updown_decoder.UpDownDecoder": "updown",
    "captioning.models.transformer_decoder.TransformerDecoder": "transformer",
    "captioning.data.shapes.build_shapes": "shapes",
    "captioning.data.karpathy.read_karpathy_splits": "karpathy",
    "captioning.data.coco_captions.read_coco_captions": "coco",
    "captioning.data.table.read_table": "table",
    "captioning.training.objectives.CrossEntropy": "xe",
    "captioning.training.objectives.SelfCritical": "scst",
}
# Where a stored config holds `_target_` groups of the registry.
_NAMED_AT = (("model", "encoder"), ("model", "attention"), ("model", "decoder"), ("dataset", "generate"),
             ("dataset", "reader"), ("objective",))
MOVED_KEYS: dict[str, str] = {
    "trainer.attention_weight": "objective.attention_weight",
    "trainer.attention_reduction": "objective.attention_reduction",
    **{f"trainer.reinforce.{k}": f"objective.{k}" for k in _REINFORCE},
}


def moved_key(key: str) -> str | None:
    """Where an old dotted key lives now (None: it did not move)."""
    return MOVED_KEYS.get(key)


def moved_override(override: str) -> str | None:
    """A command-line override with its moved key renamed (`trainer.attention_weight=1` ->
    `objective.attention_weight=1`, prefixes +, ++ and ~ kept); None when its key did not move."""
    key, sep, value = override.partition("=")
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    new = moved_key(key[len(prefix):])
    return None if new is None else f"{prefix}{new}{sep}{value}"


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A stored (resolved) config with its moved keys at their new places and its targets by name; a config of
    today comes back equal."""
    return _named(_moved_terms(config))


def _named(config: dict[str, Any]) -> dict[str, Any]:
    """The config with every `_target_` import path of `NAMED` replaced by its name (others left for the checks)."""
    found = []
    for path in _NAMED_AT:
        node: Any = config
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get("_target_"), str) and node["_target_"] in NAMED:
            found.append(path)
    if not found:
        return config
    config = copy.deepcopy(config)
    for path in found:
        node = config
        for key in path:
            node = node[key]
        node["_target_"] = NAMED[node["_target_"]]
    return config


def _moved_terms(config: dict[str, Any]) -> dict[str, Any]:
    """The loss settings of an old `trainer` section as the objective's arguments.

    The objective's own value wins over an old one; keys the stored objective does not take (self-critical
    training never used the cross-entropy REINFORCE keys) are dropped, as they were ignored then."""
    trainer = config.get("trainer")
    if not isinstance(trainer, dict) or not any(k in trainer for k in ("attention_weight", "attention_reduction",
                                                                       "reinforce")):
        return config
    config = copy.deepcopy(config)
    trainer = config["trainer"]
    objective = config.get("objective")
    objective = dict(objective) if isinstance(objective, dict) else {"_target_": "xe"}
    cross_entropy = NAMED.get(str(objective.get("_target_")), objective.get("_target_")) == "xe"
    reinforce = trainer.pop("reinforce", None)
    old = {k: trainer.pop(k) for k in ("attention_weight", "attention_reduction") if k in trainer}
    old.update(reinforce if isinstance(reinforce, dict) else {})
    for key, value in old.items():
        if cross_entropy or key in SHARED_TERMS:
            objective.setdefault(key, value)
    config["objective"] = objective
    return config
