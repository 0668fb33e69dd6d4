"""The assembly: everything built from a config or a checkpoint is built here, above the parts it builds
(models/, data/, training/), so none of those imports another to build it.

    registry.py     the only classes a config or checkpoint may name (`_target_` keys), and `build`
    models.py       build_encoder, build_captioner: a captioner from the encoder, attention and decoder groups
    datasets.py     build_datasets: the splits, vocabulary and feature cache of a `dataset` config
    checkpoints.py  load_model: a checkpoint's config checked against the registry, then built and loaded
    run.py          build_run: the parts a training run is made of, handed to the Trainer
"""
