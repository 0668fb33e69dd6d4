import re

import pytest

from captioning.data import vocab
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


def _nltk_tokenize(text: str) -> list[str]:
    from nltk.tokenize import TreebankWordTokenizer

    return [t for t in TreebankWordTokenizer().tokenize(text.lower()) if not re.match(r"^[^\w]+$", t)]


def test_tokenize_shortcut_gives_what_nltk_gives():
    """The plain-caption shortcut of `tokenize` against NLTK's Treebank tokenizer on every kind of caption."""
    from synthetic_text import karpathy_file, realistic_corpus

    candidates, references = realistic_corpus(3000, seed=5)
    texts = [*candidates.values(), *(r for refs in references.values() for r in refs)]
    texts += [s["raw"] for img in karpathy_file({"train": 400}, seed=2)["images"] for s in img["sentences"]]
    texts += ["", " ", ".", "!", "a dog.", "a dog .", "a dog...", "a dog!!", "a dog?", "A DOG, RUNS.", "a,b", "a,,b",
              "a, ,b", "a,1", "1,000 dogs", "a dog,", "a dog,.", ",a", "cannot", "I cannot go", "gonna gotta wanna go",
              "gimme lemme", "a cannon", "tabs\tand\nnewlines", "two  spaces", "a 3d tv", "no. 5 bus", "5.", "a.b",
              "ends with space . ", "a dog ! ", "mr. smith", "it's", "don't", "dogs' toys", "a (big) dog", "a - b",
              "a -- b", "café", "\u212a9 unit", "\u0130stanbul", "a dog:", "a:b", "a;b", "$5", "a & b", "#1", "a/b",
              "a&b", "50%", "$5", "a - b", "a-", "--a", "a--b", "what?!", "a ?b", "?.", "a,?", "a,&b", ",", ", .",
              "#1 fan", "a - - b", "-", "a dog?.", "wow!.", "a ,b", "x@y.", "a b;c", "a,-1", "a,-b", "-1,5"]
    plain = sum(bool(vocab._plain.fullmatch(t.lower())) for t in texts)
    assert plain > len(texts) // 3  # the shortcut is taken for many of them
    for text in texts:
        assert tokenize(text) == _nltk_tokenize(text), text
