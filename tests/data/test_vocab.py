import pytest

from captioning.data.vocab import SPECIALS, Vocabulary, tokenize


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("A Man's dog, running.") == ["a", "man", "'s", "dog", "running"]


def test_build_threshold_and_order():
    caps = [["a", "red", "circle"], ["a", "blue", "circle"], ["a", "red", "square"]]
    v = Vocabulary.build(caps, min_freq=2)
    assert v.itos == [*SPECIALS, "a", "circle", "red"]  # by count, then alphabetically
    assert v.encode(["a", "blue", "circle"]) == [4, v.unk_id, 5]
    assert v.decode([v.start_id, 4, 6, 5, v.end_id, 4]) == ["a", "red", "circle"]


def test_max_size_and_errors():
    v = Vocabulary.build([["x", "y", "y", "z", "z", "z"]], max_size=6)
    assert len(v) == 6 and v.itos[4:] == ["z", "y"]
    with pytest.raises(ValueError, match="empty vocabulary"):
        Vocabulary.build([["x"]], min_freq=5)
    with pytest.raises(ValueError, match="special tokens"):
        Vocabulary(["a", "b"])
    assert Vocabulary(v.to_list()) == v
