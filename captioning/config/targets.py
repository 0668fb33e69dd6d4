"""`_target_` groups checked against their target's signature, without importing any name a config gives.

A group with a `_target_` (encoder, attention, decoder, optim, scheduler, dataset.generate, dataset.reader, and any
`_target_` group added later) has no schema of its own: its keys are bound to the signature of the class or
function it names (captioning/base/signature.py), so unknown keys, types, choices, the constraints declared in
the signature (`Annotated[int, Range(ge=1)]`) and missing arguments are reported before anything is built.

Where the target is looked up, by the group's config key:

* the registry (captioning/factory/registry.py): the group whose config key it is (`registry.group_at`): the only
  encoders, attentions, decoders, data set generators and readers there are. A new `_target_` group (say
  `objective`) gets one dict in `registry.GROUPS` and is validated from then on, with no edit here or in the schema;
* `optim` and `scheduler`: the classes of torch.optim and torch.optim.lr_scheduler, looked up by name in those two
  modules only (a subclass of their base class), never imported from the string.

POLICY is the constraints this project adds to torch's classes, whose signatures it does not own: no default is
repeated here (the YAML has them), only what our training loop requires of the values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from captioning.base.constraints import Constraint, OneOf, Problem, Range, choose_one
from captioning.base.signature import argument_problems
from captioning.checkpoint.moved import NAMED
from captioning.factory import registry
from captioning.training import schedule

# config key -> (module, base class, arguments the trainer passes itself); such groups are built later (_partial_).
TORCH_GROUPS: dict[str, tuple[Any, type, tuple[str, ...]]] = {
    "optim": (torch.optim, torch.optim.Optimizer, ("params",)),
    "scheduler": (torch.optim.lr_scheduler, torch.optim.lr_scheduler.LRScheduler, ("optimizer",)),
}
POLICY: dict[str, dict[str, Constraint]] = {
    "optim": {"lr": Range(gt=0), "weight_decay": Range(ge=0), "eps": Range(gt=0), "betas": Range(ge=0, lt=1),
              "alpha": Range(ge=0, lt=1), "momentum": Range(ge=0, lt=1), "dampening": Range(ge=0, le=1)},
    "scheduler": {"factor": Range(gt=0, lt=1), "patience": Range(ge=0), "threshold": Range(ge=0),
                  "cooldown": Range(ge=0), "min_lr": Range(ge=0), "step_size": Range(ge=1), "gamma": Range(gt=0, le=1),
                  "T_max": Range(ge=1), "eta_min": Range(ge=0), "warmup_steps": Range(ge=1)},
    # Every metric trainer.monitor may name is higher-is-better.
    "scheduler.ReduceLROnPlateau": {"mode": OneOf("max")},
}


# This project's own classes of a torch group (a per-step warm-up schedule).
OWN_CLASSES: dict[str, dict[str, type]] = {
    "scheduler": {"captioning.training.schedule.InverseSqrtWarmup": schedule.InverseSqrtWarmup}}


def torch_classes(key: str) -> dict[str, type]:
    """The classes a torch group may name, by `_target_` (e.g. 'torch.optim.Adam'), and this project's own."""
    module, base, _ = TORCH_GROUPS[key]
    return {**{f"{module.__name__}.{n}": c for n, c in vars(module).items()
               if isinstance(c, type) and issubclass(c, base) and c is not base and not n.startswith("_")},
            **OWN_CLASSES.get(key, {})}


def targets_at(key: str) -> tuple[Mapping[str, Callable[..., Any]], tuple[str, ...], str] | None:
    """What the group at config key `key` may name, the arguments its builder passes, and where a new one goes."""
    group = registry.group_at(key)
    if group is not None:
        where = "its line in captioning/factory/registry.py"
        return registry.GROUPS[group], registry.BUILDER_ARGS.get(group, ()), where
    if key in TORCH_GROUPS:
        return torch_classes(key), TORCH_GROUPS[key][2], f"a class of {TORCH_GROUPS[key][0].__name__}"
    return None


def target_problems(v: Mapping[str, Any], key: str) -> Iterator[Problem]:
    """Problems of the `_target_` group `v` at config key `key`: its target, then its keys against the signature."""
    found = targets_at(key)
    if found is None:
        known = ", ".join([registry.CONFIG_KEYS.get(g, g) for g in registry.GROUPS] + list(TORCH_GROUPS))
        yield key, (f"a _target_ group this project cannot check (those it can: {known}); give it a group in "
                    "captioning/factory/registry.py GROUPS")
        return
    table, reserved, where = found
    target = v.get("_target_")
    short = {t.rsplit(".", 1)[-1]: t for t in table}
    if target is None:
        yield key, f"no _target_; choose one of {', '.join(short)}"
        return
    if target in NAMED and NAMED[target] in table:
        yield f"{key}._target_", f"{target!r} is now named {NAMED[target]!r} (captioning/factory/registry.py)"
        return
    if target not in table:
        choices = choose_one(str(target).rsplit(".", 1)[-1], list(short))
        yield key, f"unknown type {target!r}; {choices} (a new one needs {where})"
        return
    kwargs = {k: x for k, x in v.items() if k != "_target_"}
    if key in TORCH_GROUPS and kwargs.pop("_partial_", None) is not True:
        yield f"{key}._partial_", f"must be true (the trainer builds it later, passing {', '.join(reserved)})"
    fn = table[target]
    policy = {**POLICY.get(key, {}), **POLICY.get(f"{key}.{getattr(fn, '__name__', '')}", {})}
    for p in argument_problems(fn, kwargs, reserved, policy):
        yield (f"{key}.{p.key}" if p.key else key), p.message
