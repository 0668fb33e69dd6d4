"""Greedy decoding and beam search: k=1 is greedy, a wide beam finds the exact optimum."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from captioning.data.vocab import Vocabulary
from captioning.decoding import beam_search, generate, greedy_decode


@pytest.fixture
def encoded(tiny_model):
    tiny_model.eval()
    torch.manual_seed(3)
    a, _ = tiny_model.encode(torch.randn(5, 3, 32, 32))
    return tiny_model.decoder, a


def test_beam_size_one_is_exactly_greedy(encoded):
    dec, a = encoded
    g, b = greedy_decode(dec, a, max_len=8), beam_search(dec, a, beam_size=1, max_len=8)
    assert g.tokens == b.tokens
    torch.testing.assert_close(g.scores, b.scores)
    for ga, ba in zip(g.alphas, b.alphas):
        torch.testing.assert_close(ga, ba)


def test_attention_maps_match_words(encoded):
    dec, a = encoded
    out = beam_search(dec, a, beam_size=3, max_len=6)
    for toks, alpha in zip(out.tokens, out.alphas):
        assert alpha.shape == (len(toks), a.shape[1])
        assert Vocabulary.end_id not in toks and Vocabulary.start_id not in toks
        torch.testing.assert_close(alpha.sum(-1), torch.ones(len(toks)))


def _sequence_logprob(dec, a, seq):
    """log p(seq) by teacher forcing, renormalised without <start>/<pad> as decoding does."""
    caps = torch.tensor([[Vocabulary.start_id, *seq]])
    logits = dec(a, caps).logits[0]
    logits[:, [Vocabulary.pad_id, Vocabulary.start_id]] = float("-inf")
    return F.log_softmax(logits, -1)[torch.arange(len(seq)), torch.tensor(seq)].sum().item()


def test_wide_beam_finds_the_exact_best_sequence(encoded):
    dec, a = encoded
    a = a[:1]
    V, max_len = dec.vocab_size, 3
    best, best_lp = None, float("-inf")
    # Enumerate every sequence of at most max_len words (ending with <end>, or cut at max_len).
    words = [w for w in range(V) if w not in (Vocabulary.pad_id, Vocabulary.start_id)]
    for n in range(1, max_len + 1):
        for seq in itertools.product(words, repeat=n):
            if Vocabulary.end_id in seq[:-1] or (n < max_len and seq[-1] != Vocabulary.end_id):
                continue
            lp = _sequence_logprob(dec, a, list(seq))
            if lp > best_lp:
                best, best_lp = list(seq), lp
    out = beam_search(dec, a, beam_size=V * V, max_len=max_len)
    expected = best[:-1] if best[-1] == Vocabulary.end_id else best
    assert out.tokens[0] == expected
    assert out.scores[0].item() == pytest.approx(best_lp, abs=1e-4)


def test_generate_and_bad_beam(tiny_model):
    tiny_model.eval()
    decoded, grid = generate(tiny_model, torch.randn(2, 3, 32, 32), beam_size=2, max_len=5)
    assert grid == (8, 8) and len(decoded.tokens) == 2
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(tiny_model.decoder, torch.randn(1, 4, 16), beam_size=0, max_len=3)
