"""Prepared captions: a data set's captions read, checked and tokenised once, then opened memory-mapped.

    arrays.py  `CaptionTable`: every split's captions as flat arrays; `SplitView`, read like a list of records
    store.py   `open_or_prepare`: the sets stored under `dataset.prepared`, keyed by what decides their content
"""
