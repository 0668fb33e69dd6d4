"""format_metric: the one rule by which the report page and the sweep table write a metric."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.reporting.numbers import format_metric


@pytest.mark.parametrize("name, value, text", [
    # counts: integers
    ("num_images", 250, "250"), ("epochs", 23, "23"), ("beam_size", 3, "3"), ("attention_words", 892, "892"),
    ("best_epoch", np.int64(17), "17"),
    # durations: one decimal
    ("train_seconds", 600.3, "600.3"), ("train_seconds", 376.1, "376.1"), ("train_seconds", 1234.56, "1234.6"),
    ("seconds", 1.5, "1.5"), ("train_seconds", 600.0, "600.0"),
    # scores: four decimals, whatever their size
    ("Bleu_4", 0.7395276112474457, "0.7395"), ("METEOR", 0.4656856312831718, "0.4657"), ("ROUGE_L", 0.8, "0.8000"),
    ("CIDEr", 2.9279780033133402, "2.9280"), ("SPICE", 0.2, "0.2000"), ("attention_correctness", 0.6022695, "0.6023"),
    ("val_CIDEr", 3.0327403069283982, "3.0327"), ("CIDEr", 12.5, "12.5000"), ("CIDEr", 0.0, "0.0000"),
    ("Bleu_4", np.float32(0.25), "0.2500"),
    # nothing to show, text, flags, structures
    ("CIDEr", None, ""), ("attention_correctness", float("nan"), ""), ("split", "test", "test"),
    ("tokenizer", "ptb-java", "ptb-java"), ("flag", True, "True"),
    ("skipped", {"spice": "no java"}, '{"spice": "no java"}'), ("ids", [1, 2], "[1, 2]"),
])
def test_metrics_are_written_by_what_they_are(name, value, text):
    assert format_metric(name, value) == text
