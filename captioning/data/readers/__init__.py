"""Annotation files read into `ImageRecord`s (records.py), without torch.

    records.py        `ImageRecord`, the splits
    paths.py          image paths that annotation files give stay under the image root
    karpathy.py       Karpathy split files (dataset_*.json)
    coco_captions.py  raw COCO caption files
    table.py          your own data: a CSV or JSON Lines table
    convert.py        records written back as a Karpathy split file
    references.py     reference captions and results files for scoring (`captioning-score`, `captioning-html`)
"""
