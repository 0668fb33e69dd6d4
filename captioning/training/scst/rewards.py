"""Caption rewards for self-critical training: CIDEr-D (and BLEU-4) of each sampled caption against the training
references of its image, with CIDEr-D's document frequencies computed once from the whole training split.

The end token. As Rennie et al. (2017) and ruotianluo/self-critical.pytorch do, a caption that ended is scored with
its end token appended as one more word, and so is every reference (`end_token=True`): n-grams such as
"a red <end>" then match no reference, so captions that stop mid-phrase ("bad endings") earn less. A caption cut at
max_len without an end token is scored without one. With `end_token=False` the reward is exactly coco-caption's
CIDEr-D (document frequencies from the training references; tests/training/test_scst.py).

References are tokenized as `captioning-score` tokenizes them: with the data set's tokenizer (`dataset.tokenizer`),
the PTB tokenizer (punctuation dropped) for `ptb`, the data set's own rule for the others (captioning/metrics/
languages.py); candidates are the model's words, which are such tokens already.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from captioning.data.tokenizers import DEFAULT_TOKENIZER
from captioning.metrics.cider import CiderD
from captioning.metrics.fast_scores import bleu
from captioning.metrics.languages import split_captions
from captioning.metrics.tokenizer import ptb_tokenize

END_WORD = "<end>"  # the end token as a scored word: never a PTB token, so it only matches other end tokens


def caption_text(words: Sequence[str], ended: bool, end_token: bool = True) -> str:
    """A caption as the reward scores it: its words, then the end token if it ended (and `end_token`)."""
    return " ".join([*words, END_WORD] if ended and end_token else words)


class CaptionReward:
    """r = cider_weight CIDEr-D + bleu4_weight BLEU-4 of each caption against the references of its image.

    `references[i]` holds the raw reference captions of training image i (the data set's index); they are
    tokenized once by `tokenizer` (the data set's: ptb, whitespace, char), and CIDEr-D's document frequencies come
    from all of them (`CiderD`, built once).
    """

    METRICS = ("CIDEr", "Bleu_4")  # what the reward can be made of

    def __init__(self, references: Sequence[Sequence[str]], cider_weight: float = 1.0, bleu4_weight: float = 0.0,
                 end_token: bool = True, tokenizer: str = DEFAULT_TOKENIZER):
        if cider_weight < 0 or bleu4_weight < 0 or cider_weight + bleu4_weight == 0:
            raise ValueError(f"reward weights must be >= 0 and not all 0, got CIDEr {cider_weight}, "
                             f"BLEU-4 {bleu4_weight}")
        self.weights = {"CIDEr": float(cider_weight), "Bleu_4": float(bleu4_weight)}
        self.end_token = end_token
        raw: dict[Hashable, Sequence[str]] = {i: list(refs) for i, refs in enumerate(references)}
        tokens = ptb_tokenize(raw) if tokenizer == "ptb" else split_captions(raw, tokenizer)
        self.references = [[caption_text(r.split(), True, end_token) for r in tokens[i]] for i in range(len(tokens))]
        self.cider = CiderD(dict(enumerate(self.references)))

    def text(self, words: Sequence[str], ended: bool) -> str:
        """The string this reward scores for a caption."""
        return caption_text(words, ended, self.end_token)

    def cider_d(self, images: Sequence[int], captions: Sequence[str]) -> np.ndarray:
        """CIDEr-D (N,) of each caption (a `text`) against the references of the training image beside it."""
        return self.cider.score_many(list(images), list(captions))

    def bleu4(self, images: Sequence[int], captions: Sequence[str]) -> np.ndarray:
        """coco-caption's per-image BLEU-4 (N,) of each caption, every caption on its own."""
        gts: dict[Hashable, Sequence[str]] = {k: self.references[i] for k, i in enumerate(images)}
        res: dict[Hashable, Sequence[str]] = {k: [c] for k, c in enumerate(captions)}
        _, per_image = bleu(gts, res)
        return np.asarray(per_image[3], dtype=np.float64)

    def scores(self, images: Sequence[int], captions: Sequence[str]) -> dict[str, np.ndarray]:
        """The metrics the reward is made of (CIDEr always, for the logs), each (N,)."""
        out = {"CIDEr": self.cider_d(images, captions)}
        if self.weights["Bleu_4"]:
            out["Bleu_4"] = self.bleu4(images, captions)
        return out

    def __call__(self, scores: dict[str, np.ndarray]) -> np.ndarray:
        """The reward (N,) from `scores`."""
        return sum(w * scores[m] for m, w in self.weights.items() if w)  # type: ignore[return-value]
