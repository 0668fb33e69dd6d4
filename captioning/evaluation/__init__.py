"""Evaluating a model on a split: real decoding (greedy or beam search, never teacher forcing), the scores papers
report, and the files an evaluation leaves.

    split.py    decode_split, score_predictions, attention correctness on COCO masks, and evaluate_split: the one
                chain `captioning-evaluate` and the end of training run
    outputs.py  write_outputs: metrics.json, results, figures, report.html and attention.npz of a decoded split
"""
