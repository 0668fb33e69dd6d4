"""The one checkpoint room: the file format (`file.py`: a plain dict of state_dicts, the resolved config and the
vocabulary, written atomically, read as data) and what changed in what it stores (`moved.py`: config keys that
moved and the import paths components were named by before their registered names, mapped once, so that old
checkpoints and command lines still work). Building a model from a checkpoint is the assembly's
(`captioning.factory.load.load_model`)."""

from captioning.checkpoint.file import (
    FORMAT,
    check_checkpoint_file,
    check_weights,
    checkpoint_vocabulary,
    load_same_model,
    read_checkpoint,
    same_model,
    save_checkpoint,
)

__all__ = ["FORMAT", "check_checkpoint_file", "check_weights", "checkpoint_vocabulary", "load_same_model",
           "read_checkpoint", "same_model", "save_checkpoint"]
