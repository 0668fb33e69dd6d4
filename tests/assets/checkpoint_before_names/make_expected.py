"""Run at commit 1b42c34 (components named by import path) as `python make_expected.py FOLDER`: writes the
captions tests/factory/test_old_checkpoint.py expects for FOLDER's PNG images (greedy and beam 3)."""

import json
import sys
from pathlib import Path

import captioning

folder = Path(sys.argv[1])
model = captioning.load(folder / "checkpoint.pt")
images = sorted(str(p) for p in folder.glob("*.png"))
out = {}
for beam in (1, 3):
    results = model.caption(images, beam_size=beam)
    out[f"beam_{beam}"] = [{"image": Path(r.source).name, "caption": r.caption, "log_prob": r.log_prob,
                            "attention_sum": float(r.attention.sum()),
                            "attention_00": r.attention.reshape(len(r.words), -1)[:, 0].tolist()}
                           for r in results]
(folder / "expected.json").write_text(json.dumps(out, indent=1))
