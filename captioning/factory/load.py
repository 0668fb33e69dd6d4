"""Loading a model from a checkpoint written by anyone: its config is checked against the registry (only this
project's classes, with arguments of their constructors) before anything is built (see SECURITY.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from captioning.base.decoding import ENSEMBLE_MEAN
from captioning.checkpoint import check_weights, checkpoint_vocabulary, read_checkpoint
from captioning.checkpoint.moved import upgrade_config
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner
from captioning.factory.registry import ModelSpecError, check_data, group_at, resolve
from captioning.models.captioner import Captioner
from captioning.models.ensemble import Ensemble, EnsembleMean

MODEL_GROUPS = ("encoder", "attention", "decoder")


class UnsafeCheckpointError(ModelSpecError):
    """A checkpoint whose config names code outside this project's registry, or arguments it does not take."""


def check_config(ckpt: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's config, once its model and dataset sections are known to be plain data for this project.

    `model.*` must name registered classes with arguments of their constructors; `dataset` may only be plain
    values, except `dataset.generate` and `dataset.reader`, which must name a registered data set generator
    (e.g. build_shapes) and reader (read_karpathy_splits, read_coco_captions) with arguments of their signatures.
    Other sections (optim, trainer...) are never built from a checkpoint.
    """
    config = ckpt.get("config")
    if isinstance(config, dict):
        config = ckpt["config"] = upgrade_config(config)  # keys that moved since it was written, at their places
    try:
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise ModelSpecError("it has no model config")
        model = config["model"]
        for key in model:
            if key not in MODEL_GROUPS:
                raise ModelSpecError(f"model.{key} is not a model group ({', '.join(MODEL_GROUPS)})")
        for group in MODEL_GROUPS:
            if model.get(group) is None:
                raise ModelSpecError(f"the model config has no 'model.{group}' group")
            resolve(group, model[group], f"model.{group}")
        dataset = config.get("dataset")
        if dataset is not None:
            if not isinstance(dataset, dict):
                raise ModelSpecError(f"dataset must be a mapping, got {type(dataset).__name__}")
            for key, value in dataset.items():
                data_group = group_at(f"dataset.{key}")  # generate, reader: built by captioning-evaluate
                if data_group is not None and value is not None:
                    resolve(data_group, value, f"dataset.{key}")
                else:
                    check_data({key: value}, "dataset")
    except ModelSpecError as err:
        raise UnsafeCheckpointError(f"checkpoint {path}: {err}; refusing to load it") from None
    return config


def no_downloads(spec: Any) -> Any:
    """An encoder spec with pretrained=false and weights=null wherever it has the keys (encoder=multi: in each of
    its encoders), so that loading a checkpoint, which holds the weights, never downloads or reads them again."""
    if not isinstance(spec, dict):
        return spec  # the builder's checks report it
    spec = {**spec, **{k: v for k, v in (("pretrained", False), ("weights", None)) if k in spec}}
    if isinstance(spec.get("encoders"), list):
        spec["encoders"] = [no_downloads(e) for e in spec["encoders"]]
    return spec


def load_model(path: str | os.PathLike,
               map_location: str | torch.device = "cpu") -> tuple[Captioner, Vocabulary, dict[str, Any]]:
    """Rebuild the model from a checkpoint's (checked) config and load its weights; returns model, vocab, checkpoint.

    The model is first built on the `meta` device (shapes only, no memory) and every parameter's and buffer's
    shape and dtype compared with the stored weights, so a config asking for more than its weights hold is
    refused before anything is allocated: a real model is built only once it is known to be the size of the
    weights the file holds.

    Raises UnsafeCheckpointError (a ValueError, one line) for a config naming anything but this project's
    components, and ValueError for a config, vocabulary or weights that do not make a model.
    """
    ckpt = read_checkpoint(path, map_location)
    model_cfg = dict(check_config(ckpt, path)["model"])
    vocab = checkpoint_vocabulary(ckpt, path)
    model_cfg["encoder"] = no_downloads(model_cfg["encoder"])  # the checkpoint holds the weights
    weights: Any = ckpt.get("model")
    with torch.device("meta"):  # shapes only: nothing is allocated
        shapes = _build(model_cfg, len(vocab), path)
    check_weights(shapes.state_dict(), weights, len(vocab), path)
    model = _build(model_cfg, len(vocab), path)  # now known to be the size of the stored weights
    model.load_state_dict(weights)  # check_weights: the same keys, shapes and dtypes
    model.to(map_location).eval()
    return model, vocab, ckpt


def load_ensemble(paths: Sequence[str | os.PathLike], map_location: str | torch.device = "cpu",
                  mean: EnsembleMean = ENSEMBLE_MEAN,
                  maps_from: int = 0) -> tuple[Captioner, Vocabulary, dict[str, Any]]:
    """The models of several checkpoints decoding as one (`captioning.models.ensemble`); returns the model, the
    shared vocabulary and the first checkpoint (whose data set an evaluation reads). One checkpoint is its own model,
    as `load_model` gives it.

    Each checkpoint is loaded and checked as by `load_model`; one whose vocabulary is not the first's, word for word,
    is refused in one line (ValueError), and so are an empty list and models an ensemble cannot join (`Ensemble`).
    """
    if not paths:
        raise ValueError("an ensemble needs at least one checkpoint: checkpoint=[a.pt,b.pt]")
    models, vocab, first = [], None, None
    for path in paths:
        model, own, ckpt = load_model(path, map_location)
        if vocab is None:
            vocab, first = own, ckpt
        elif own.itos != vocab.itos:
            raise ValueError(vocabulary_difference(paths[0], vocab, path, own))
        models.append(model)
    assert vocab is not None and first is not None
    if len(models) == 1 and maps_from == 0:
        return models[0], vocab, first
    return Ensemble(models, mean, maps_from).eval(), vocab, first


def vocabulary_difference(path: str | os.PathLike, vocab: Vocabulary, other_path: str | os.PathLike,
                          other: Vocabulary) -> str:
    """One line saying how two checkpoints' vocabularies differ, and that an ensemble needs one vocabulary."""
    at = next((i for i, (w, v) in enumerate(zip(vocab.itos, other.itos)) if w != v), min(len(vocab), len(other)))
    word = other.itos[at] if at < len(other) else "(none)"
    mine = vocab.itos[at] if at < len(vocab) else "(none)"
    return (f"checkpoint {other_path} has another vocabulary than {path} ({len(other)} vs {len(vocab)} words; word "
            f"{at} is {word!r} vs {mine!r}): an ensemble's models must share one vocabulary (train them on the same "
            "data set with the same vocabulary settings)")


def _build(model_cfg: dict[str, Any], vocab_size: int, path: str | os.PathLike) -> Captioner:
    try:
        return build_captioner(model_cfg, vocab_size, prefix="model.")
    except ModelSpecError as err:
        raise UnsafeCheckpointError(f"checkpoint {path}: {err}; refusing to load it") from None
    except (TypeError, AttributeError, KeyError, IndexError, RuntimeError, ValueError,
            NotImplementedError) as err:  # checked types, odd values
        raise ValueError(f"checkpoint {path}: its model config does not build a model "
                         f"({type(err).__name__}: {_first_line(err)})") from err


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:2])[:300]
