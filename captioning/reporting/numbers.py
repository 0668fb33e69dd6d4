"""How a metric is written in a table: the one rule the report page (page.py) and the sweep table (sweep.py) share.

A metric is written by what it is, told by its value and its name: a count (num_images, epochs, beam_size,
attention_words: an int in metrics.json) as an integer; a duration (a name ending in `seconds`, e.g. train_seconds)
with SECONDS_PLACES decimals; every other number (BLEU, METEOR, ROUGE_L, CIDEr, SPICE, attention_correctness,
val_*, per-image scores) is a score, with SCORE_PLACES decimals, so a column's numbers line up.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

SCORE_PLACES = 4
SECONDS_PLACES = 1


def is_duration(name: str) -> bool:
    """Whether a metric's name says it is a time in seconds (`seconds`, `train_seconds`, ...)."""
    return name == "seconds" or name.endswith("_seconds")


def format_metric(name: str, value: Any) -> str:
    """A table cell for metric `name`: an integer as an integer, seconds with SECONDS_PLACES decimals, any other
    number with SCORE_PLACES; "" for None and NaN; text as it is, and lists or dicts as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, (str, bool)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isnan(number):
            return ""
        return f"{number:.{SECONDS_PLACES if is_duration(name) else SCORE_PLACES}f}"
    return json.dumps(value, default=str)
