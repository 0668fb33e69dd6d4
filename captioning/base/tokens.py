"""The four special tokens every vocabulary starts with, and their ids: what the data (`data/vocab.py`) and the
models (`models/decoding.py`: decoding starts at <start>, stops at <end>, pads with <pad>) agree on."""

from __future__ import annotations

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
