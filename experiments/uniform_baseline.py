"""Attention correctness of uniform attention on the `shapes` test split (the chance level).

Scores a flat 8 x 8 map for every object-naming word of each test image's first reference caption.
Run after the default run has generated the data: python experiments/uniform_baseline.py [data/shapes]
"""

import json
import sys
from pathlib import Path

import numpy as np

from captioning.metrics import attention_correctness

root = Path(sys.argv[1] if len(sys.argv) > 1 else "data/shapes")
test = [i for i in json.loads((root / "dataset_shapes.json").read_text())["images"] if i["split"] == "test"]
words = [i["sentences"][0]["tokens"] for i in test]
uniform = [np.full((len(w), 8, 8), 1 / 64) for w in words]
print(attention_correctness(words, uniform, [i["word_boxes"] for i in test], [(i["height"], i["width"]) for i in test]))
