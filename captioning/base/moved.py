"""Config keys that moved, mapped once: a command line, a sweep or a checkpoint written before the move still works.

The loss settings were `trainer.attention_weight`, `trainer.attention_reduction` and `trainer.reinforce.*`; they are
now arguments of the objective (conf/objective/_terms.yaml, xe.yaml, scst.yaml): `objective.attention_weight`, ...
`captioning-train` renames such an override before Hydra sees it (and says so); a checkpoint's stored config is
read with its keys moved (captioning/factory/checkpoints.py).
"""

from __future__ import annotations

import copy
from typing import Any

# Used by both objectives (conf/objective/_terms.yaml); the other REINFORCE keys are cross-entropy's only.
SHARED_TERMS = ("attention_weight", "attention_reduction", "doubly_stochastic", "entropy_weight", "baseline_decay")
_REINFORCE = ("reward_weight", "entropy_weight", "baseline_decay", "num_samples", "reward", "reduction",
              "doubly_stochastic", "every_batch")
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
    """A stored (resolved) config with its moved keys at their new places; a config of today comes back equal.

    The objective's own value wins over an old one; keys the stored objective does not take (self-critical
    training never used the cross-entropy REINFORCE keys) are dropped, as they were ignored then."""
    trainer = config.get("trainer")
    if not isinstance(trainer, dict) or not any(k in trainer for k in ("attention_weight", "attention_reduction",
                                                                       "reinforce")):
        return config
    config = copy.deepcopy(config)
    trainer = config["trainer"]
    objective = config.get("objective")
    objective = dict(objective) if isinstance(objective, dict) else {
        "_target_": "captioning.training.objectives.CrossEntropy"}
    cross_entropy = str(objective.get("_target_", "")).endswith("CrossEntropy")
    reinforce = trainer.pop("reinforce", None)
    old = {k: trainer.pop(k) for k in ("attention_weight", "attention_reduction") if k in trainer}
    old.update(reinforce if isinstance(reinforce, dict) else {})
    for key, value in old.items():
        if cross_entropy or key in SHARED_TERMS:
            objective.setdefault(key, value)
    config["objective"] = objective
    return config
