"""Caption metrics as coco-caption computes them, and attention correctness.

* :func:`score_captions` - BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (and SPICE when installed) on
  PTB-tokenized captions, exactly as ``COCOEvalCap`` reports them.
* :class:`CiderD` - fast CIDEr-D: document frequencies computed once, many candidates scored with
  array operations (validation every epoch, CIDEr rewards); :func:`bleu` / :func:`rouge_l` - the same
  for BLEU and ROUGE-L.  All three equal pycocoevalcap's scorers bit for bit.
* :func:`ptb_tokenize` - coco-caption's PTB tokenization in pure Python (used when Java is missing).
* :func:`attention_correctness` / :func:`attention_mass_in_boxes` - share of attention on the
  named object's boxes.
"""

from captioning.metrics.attention import attention_correctness, attention_mass_in_boxes, box_coverage
from captioning.metrics.coco_attention import CocoInstances, category_mentions, coco_attention_correctness
from captioning.metrics.cider import CiderD
from captioning.metrics.coco import TOKENIZERS, VALID_METRICS, CaptionScores, java_ptb_tokenize, score_captions
from captioning.metrics.fast_scores import bleu, rouge_l
from captioning.metrics.tokenizer import PUNCTUATIONS, ptb_tokenize

__all__ = [
    "CaptionScores",
    "score_captions",
    "CiderD",
    "bleu",
    "rouge_l",
    "java_ptb_tokenize",
    "ptb_tokenize",
    "PUNCTUATIONS",
    "VALID_METRICS",
    "TOKENIZERS",
    "attention_correctness",
    "attention_mass_in_boxes",
    "box_coverage",
    "CocoInstances",
    "category_mentions",
    "coco_attention_correctness",
]
