"""Caption metrics as coco-caption computes them, and attention correctness.

* :func:`score_captions` - BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (and SPICE when installed) on
  PTB-tokenized captions, exactly as ``COCOEvalCap`` reports them.
* :class:`CiderD` - fast CIDEr-D: document frequencies computed once, many candidates scored with
  array operations (validation every epoch, CIDEr rewards); :func:`bleu` / :func:`rouge_l` - the same
  for BLEU and ROUGE-L.  All three equal pycocoevalcap's scorers bit for bit.
* :func:`ptb_tokenize` - coco-caption's PTB tokenization in pure Python (used when Java is missing).
* :func:`attention_correctness` / :func:`attention_mass_in_boxes` - share of attention on the
  named object's boxes.

Every name is imported on first use (PEP 562), so ``from captioning.metrics import CiderD`` loads only
the CIDEr module: scoring text (``captioning-score``) never imports the attention-correctness code and,
through it, pycocotools and torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    "CaptionScores": "coco",
    "score_captions": "coco",
    "java_ptb_tokenize": "java",
    "VALID_METRICS": "coco",
    "TOKENIZERS": "coco",
    "CiderD": "cider",
    "bleu": "fast_scores",
    "rouge_l": "fast_scores",
    "ptb_tokenize": "tokenizer",
    "PUNCTUATIONS": "tokenizer",
    "attention_correctness": "attention",
    "attention_mass_in_boxes": "attention",
    "box_coverage": "attention",
    "CocoInstances": "coco_attention",
    "category_mentions": "coco_attention",
    "coco_attention_correctness": "coco_attention",
    "caption_diversity": "diversity",
    "collapsed_caption": "diversity",
    "collapse_note": "diversity",
    "diversity_and_collapse": "diversity",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load lazily below
    from captioning.metrics.attention import attention_correctness, attention_mass_in_boxes, box_coverage
    from captioning.metrics.cider import CiderD
    from captioning.metrics.coco import TOKENIZERS, VALID_METRICS, CaptionScores, score_captions
    from captioning.metrics.coco_attention import CocoInstances, category_mentions, coco_attention_correctness
    from captioning.metrics.diversity import caption_diversity, collapse_note, collapsed_caption, diversity_and_collapse
    from captioning.metrics.fast_scores import bleu, rouge_l
    from captioning.metrics.java import java_ptb_tokenize
    from captioning.metrics.tokenizer import PUNCTUATIONS, ptb_tokenize


def __getattr__(name: str) -> Any:
    """Import the submodule defining a public name on first access, and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    """The module's attributes, lazy public names included."""
    return sorted(set(globals()) | set(_EXPORTS))
