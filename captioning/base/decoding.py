"""The decoding defaults of the Python API and the commands' options: one copy of each fact.

A run's values come from its config (conf/eval/default.yaml's beam_size and max_len, the same numbers:
tests/config/test_one_default_per_fact.py holds the two together); `Captioner.generate`,
`captioning.load(...).caption`, the exported-model runner and the commands' --beam-size / --max-len read these.
Plain values, nothing but `typing` imported: the torch-free runner (captioning/export/runner.py) reads them too.
"""

from typing import Final

BEAM_SIZE = 3  # hypotheses kept per image by beam search (1: greedy decoding)
MAX_LEN = 20  # most words of a decoded caption (its <end> not counted)
# decoding never emits <unk> (its probability is renormalised away, as ruotianluo's suppress_UNK): a caption says
# "a man in a red shirt" rather than "a man in a <unk> shirt"; conf/eval/default.yaml's eval.suppress_unk
SUPPRESS_UNK = True
# how a test-time ensemble mixes its models' words (conf/evaluate.yaml's ensemble.mean, the same value): the mean of
# their probabilities ("prob"), or of their log-probabilities ("logprob"); captioning/models/ensemble.py
ENSEMBLE_MEAN: Final = "prob"
