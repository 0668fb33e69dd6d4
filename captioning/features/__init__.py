"""The feature cache: a frozen encoder's annotation grids of every image, computed once and stored on disk. It sits
above the models, since an encoder makes it, and below the factory that opens it for a run.

    cache.py        `FeatureCache`: a finished cache read (memory-mapped), checked against the model's encoder
    extract.py      `extract_features`: a cache written, or an interrupted one continued
    fingerprint.py  what decides an encoder's features (config, weights' SHA-256, preprocessing)
    checks.py       its files checked before anything trusts them (JSON types, grids.npy's layout, finite rows)
    disk.py         how big a cache is; a refusal before extraction when it will not fit
    npy.py          a .npy file's layout read from its header alone
"""
