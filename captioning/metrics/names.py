"""The metrics scoring computes, by the names a config or command line gives them, and the coco-caption scores each
produces: what the config checker (captioning/config/schema.py) reads without loading a scorer or the tokenizer."""

from __future__ import annotations

#: Metric names accepted by :func:`captioning.metrics.coco.score_captions` -> the coco-caption score names they produce.
VALID_METRICS: dict[str, tuple[str, ...]] = {
    "bleu": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
    "meteor": ("METEOR",),
    "rouge": ("ROUGE_L",),
    "cider": ("CIDEr",),
    "spice": ("SPICE",),
}
