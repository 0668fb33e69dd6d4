"""Greedy decoding and beam search: k=1 is greedy, a wide beam finds the exact optimum. The searches are tested over
every word, <unk> (id 3) one like any other (suppress_unk=False); suppressing it is tested on its own, at the end."""

import itertools
import math
import random
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from captioning.data.vocab import Vocabulary
from captioning.models import decoding
from captioning.models.attention import AttentionOutput, HardAttention, SoftAttention
from captioning.models.decoders.sat import ShowAttendTellDecoder

beam_search = partial(decoding.beam_search, suppress_unk=False)
greedy_decode = partial(decoding.greedy_decode, suppress_unk=False)


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
    decoded, grid = tiny_model.generate(torch.randn(2, 3, 32, 32), beam_size=2, max_len=5)
    assert grid == (8, 8) and len(decoded.tokens) == 2
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(tiny_model.decoder, torch.randn(1, 4, 16), beam_size=0, max_len=3)


# --- table-driven toy decoders: log p(next word | image, prefix) read from a table --------------------------------

END = Vocabulary.end_id


def _prefix(code: int, V: int) -> tuple[int, ...]:
    """The words a prefix code holds (base-V digits after the leading <start>)."""
    digits = []
    while code:
        code, d = divmod(code, V)
        digits.append(d)
    return tuple(reversed(digits))[1:]


class TableDecoder:
    """A fake decoder with the decoding interface; the state is (image id, prefix code), both row first."""

    def __init__(self, table, vocab_size: int):
        self.table, self.V = table, vocab_size
        self.attention = SimpleNamespace(prepare=lambda a, grid=None, mask=None: a)

    def init_state(self, a, mask=None):
        return a[:, 0, 0].long(), torch.zeros(a.shape[0], dtype=torch.long)  # image id, prefix code

    def step(self, words, state, a, keys, mask=None):
        img, code = state
        code = code * self.V + words
        logits = torch.tensor([self.table(i, _prefix(c, self.V)) for i, c in zip(img.tolist(), code.tolist())])
        alpha = self.alpha(code)
        return logits, (img, code), AttentionOutput(torch.bmm(alpha.unsqueeze(1), a).squeeze(1), alpha)

    @staticmethod
    def alpha(code: torch.Tensor) -> torch.Tensor:
        """A map over L = 3 regions that depends on the whole prefix."""
        return torch.softmax(torch.sin(code.double().unsqueeze(1) * torch.tensor([0.37, 0.91, 1.3])).float(), 1)


def _images(B: int) -> torch.Tensor:
    a = torch.zeros(B, 3, 2)  # (B, L, D); a[b, 0, 0] tells the decoder which image it is
    a[:, 0, 0] = torch.arange(B)
    return a


def _prob_table(tree: dict, default: dict, V: int):
    def table(img, prefix):
        probs = tree.get(prefix, default)
        return [math.log(probs[w]) if probs.get(w, 0) > 0 else float("-inf") for w in range(V)]
    return table


def _random_table(seed: int, V: int, end_bias: float):
    cache = {}

    def table(img, prefix):
        key = (seed, img, prefix)
        if key not in cache:
            rng = random.Random(str(key))
            cache[key] = [rng.gauss(0, 1) + (end_bias if w == END else 0.0) for w in range(V)]
        return cache[key]
    return table


def _log_p(table, img: int, seq: tuple[int, ...], V: int) -> float:
    """log p(seq) under a table, renormalised without <start>/<pad> as decoding does."""
    total = 0.0
    for t, w in enumerate(seq):
        logits = torch.tensor(table(img, seq[:t]))
        logits[[Vocabulary.pad_id, Vocabulary.start_id]] = float("-inf")
        total += F.log_softmax(logits, 0)[w].item()
    return total


def _exhaustive(table, img: int, V: int, max_len: int, lp: float) -> tuple[list[int], float]:
    """The best caption by log p / n**lp over every sequence: ended by <end> (n counts it) or cut at max_len."""
    words = [w for w in range(V) if w not in (Vocabulary.pad_id, Vocabulary.start_id)]
    best, best_norm, best_raw = None, float("-inf"), None
    for n in range(1, max_len + 1):
        for seq in itertools.product(words, repeat=n):
            if END in seq[:-1] or (n < max_len and seq[-1] != END):
                continue
            raw = _log_p(table, img, seq, V)
            if raw / n ** lp > best_norm:
                best, best_norm, best_raw = [w for w in seq if w != END], raw / n ** lp, raw
    return best, best_raw


# One caption, [3] (p 0.1), ends at step 1. Its rival [4, 5] (p 0.9) has five children that all outscore it at
# step 2, so a beam where finished captions compete for the k places drops [3] there (checked against the
# previous implementation for k = 2..5), and every child then ends at p <= 0.065.
EARLY = {(): {3: 0.1, 4: 0.9}, (3,): {END: 1.0}, (4,): {5: 1.0},
         (4, 5): {6: 0.24, 7: 0.22, 8: 0.2, 9: 0.18, 10: 0.16}}
DEEPER = {END: 0.3, 3: 0.175, 4: 0.175, 5: 0.175, 6: 0.175}


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_an_early_finished_caption_is_kept(k):
    dec = TableDecoder(_prob_table(EARLY, DEEPER, 11), 11)
    out = beam_search(dec, _images(1), beam_size=k, max_len=6)
    assert out.tokens == [[3]]
    assert out.scores[0].item() == pytest.approx(math.log(0.1), abs=1e-5)
    greedy = greedy_decode(dec, _images(1), max_len=6)  # takes 4 (p 0.9) and ends at 0.9 * 0.24 * 0.3
    assert greedy.tokens == [[4, 5, 6]] and greedy.scores[0].item() == pytest.approx(math.log(0.0648), abs=1e-5)


def test_length_penalty_lets_a_longer_caption_win():
    # [3] <end>: p 0.5, n = 2; [3, 4] <end>: p 0.45, n = 3. Raw log p prefers the first, log p / n the second.
    tree = {(): {3: 1.0}, (3,): {END: 0.5, 4: 0.5}, (3, 4): {END: 0.9, 5: 0.1}}
    dec = TableDecoder(_prob_table(tree, {END: 1.0}, 6), 6)
    for k in (2, 3):
        plain = beam_search(dec, _images(1), beam_size=k, max_len=5)
        assert plain.tokens == [[3]] and plain.scores[0].item() == pytest.approx(math.log(0.5), abs=1e-5)
        longer = beam_search(dec, _images(1), beam_size=k, max_len=5, length_penalty=1.0)
        assert longer.tokens == [[3, 4]]
        assert longer.scores[0].item() == pytest.approx(math.log(0.45), abs=1e-5)  # raw, not normalised


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("lp", [0.0, 0.7, 2.0])
def test_a_wide_beam_is_exhaustive_search_on_random_trees(seed, lp):
    V, B, max_len = 6, 3, 1 + seed % 4  # words: <end>, 3, 4, 5; k = 4**max_len keeps every prefix
    table = _random_table(seed, V, end_bias=[-1.0, 0.0, 1.5][seed % 3])
    dec = TableDecoder(table, V)
    out = beam_search(dec, _images(B), beam_size=4 ** max_len, max_len=max_len, length_penalty=lp)
    for img in range(B):
        tokens, raw = _exhaustive(table, img, V, max_len, lp)
        assert out.tokens[img] == tokens
        assert out.scores[img].item() == pytest.approx(raw, abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_each_image_is_decoded_as_if_alone(seed):
    dec = TableDecoder(_random_table(seed, 6, end_bias=0.5), 6)
    together = beam_search(dec, _images(4), beam_size=2, max_len=5, length_penalty=0.5)
    for img in range(4):
        a = _images(4)[img:img + 1]
        alone = beam_search(dec, a, beam_size=2, max_len=5, length_penalty=0.5)
        assert alone.tokens[0] == together.tokens[img]
        torch.testing.assert_close(alone.scores[0], together.scores[img])
        torch.testing.assert_close(alone.alphas[0], together.alphas[img])


@pytest.mark.parametrize("seed", range(4))
def test_table_beam_one_is_greedy_and_maps_follow_the_prefix(seed):
    V = 7
    dec = TableDecoder(_random_table(seed, V, end_bias=0.3), V)
    g, b = greedy_decode(dec, _images(5), max_len=6), beam_search(dec, _images(5), beam_size=1, max_len=6)
    assert g.tokens == b.tokens
    torch.testing.assert_close(g.scores, b.scores)
    out = beam_search(dec, _images(5), beam_size=3, max_len=6)
    for toks, alpha in zip(out.tokens, out.alphas):
        codes = torch.tensor([int("".join(map(str, [1, *toks[:t]])), V) for t in range(len(toks))], dtype=torch.long)
        torch.testing.assert_close(alpha, TableDecoder.alpha(codes).reshape(len(toks), 3))


# --- real decoders: k = 1 is greedy; maps and scores match teacher forcing ---------------------------------------

ATTENTIONS = {"soft": partial(SoftAttention, attention_dim=16),
              "hard_argmax": partial(HardAttention, attention_dim=16, test_mode="argmax"),
              "hard_expectation": partial(HardAttention, attention_dim=16)}


def _decoder(kind: str, seed: int, end_bias: float) -> tuple[ShowAttendTellDecoder, torch.Tensor]:
    torch.manual_seed(seed)
    dec = ShowAttendTellDecoder(12, 16, ATTENTIONS[kind], embed_dim=16, hidden_dim=32, dropout=0.0).eval()
    dec.L_o.bias.data[END] += end_bias  # so that captions end at different steps
    return dec, torch.randn(6, 9, 16)


@pytest.mark.parametrize("kind", list(ATTENTIONS))
@pytest.mark.parametrize("seed", range(3))
def test_beam_one_is_exactly_greedy_on_random_decoders(kind, seed):
    dec, a = _decoder(kind, seed, end_bias=1.5)
    g, b = greedy_decode(dec, a, max_len=10), beam_search(dec, a, beam_size=1, max_len=10)
    assert g.tokens == b.tokens
    # bit for bit: with k = 1 both run the decoder on the same rows at every step (a finished caption and a done
    # image drop out at the same step), so the same arithmetic on any machine
    torch.testing.assert_close(g.scores, b.scores, rtol=0, atol=0)
    for ga, ba in zip(g.alphas, b.alphas):
        torch.testing.assert_close(ga, ba, rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(ATTENTIONS))
@pytest.mark.parametrize("lp", [0.0, 1.0])
def test_beam_maps_and_scores_match_teacher_forcing(kind, lp):
    max_len = 7
    dec, a = _decoder(kind, 5, end_bias=1.0)
    out = beam_search(dec, a, beam_size=3, max_len=max_len, length_penalty=lp)
    assert any(len(t) < max_len for t in out.tokens)  # some captions ended
    for i, (toks, alpha) in enumerate(zip(out.tokens, out.alphas)):
        seq = toks + [END] if len(toks) < max_len else toks  # shorter than max_len: ended by <end>
        forced = dec(a[i:i + 1], torch.tensor([[Vocabulary.start_id, *seq]]))
        assert alpha.shape == (len(toks), a.shape[1])
        torch.testing.assert_close(alpha, forced.alphas[0, :len(toks)], rtol=0, atol=1e-5)
        assert out.scores[i].item() == pytest.approx(_sequence_logprob(dec, a[i:i + 1], seq), abs=1e-5)


def test_bad_settings_are_refused():
    dec = TableDecoder(_prob_table({}, {END: 1.0}, 6), 6)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(dec, _images(1), max_len=0)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(dec, _images(1), beam_size=2, max_len=3, length_penalty=-1.0)


# --- n-best alternatives ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(ATTENTIONS))
@pytest.mark.parametrize("lp", [0.0, 1.0])
def test_alternatives_are_real_hypotheses_ranked_and_leave_the_search_unchanged(kind, lp):
    max_len, n = 7, 4
    dec, a = _decoder(kind, 3, end_bias=1.0)
    plain = beam_search(dec, a, beam_size=3, max_len=max_len, length_penalty=lp)
    out = beam_search(dec, a, beam_size=3, max_len=max_len, length_penalty=lp, n_best=n)
    assert plain.alternatives is None and out.tokens == plain.tokens
    # the longer search runs its last steps in batches of another size (fewer images drop out): to rounding
    torch.testing.assert_close(out.scores, plain.scores)
    assert out.alternatives is not None and len(out.alternatives) == a.shape[0]
    assert max(len(alts) for alts in out.alternatives) > 1  # the pool found others
    for i, alts in enumerate(out.alternatives):
        assert 1 <= len(alts) <= n
        assert alts[0][0] == out.tokens[i] and alts[0][2] == pytest.approx(out.scores[i].item(), abs=0)
        assert len({tuple(toks) for toks, _, _ in alts}) == len(alts)  # distinct captions
        norms = []
        for toks, alpha, score in alts:
            seq = toks + [END] if len(toks) < max_len else toks
            norms.append(score / len(seq) ** lp)
            assert score == pytest.approx(_sequence_logprob(dec, a[i:i + 1], seq), abs=1e-5)
            forced = dec(a[i:i + 1], torch.tensor([[Vocabulary.start_id, *seq]]))
            torch.testing.assert_close(alpha, forced.alphas[0, :len(toks)], rtol=0, atol=1e-5)
        assert norms[0] >= max(norms) - 1e-6  # the chosen one is the best found
        assert norms[1:] == sorted(norms[1:], reverse=True)


def test_alternatives_of_an_exhaustive_beam_are_the_best_captions_found():
    # The EARLY tree: [3] (0.1) wins; [4, 5, w] then <end> (0.9 * p_w * 0.3) are the next ones, best first.
    dec = TableDecoder(_prob_table(EARLY, DEEPER, 11), 11)
    out = beam_search(dec, _images(1), beam_size=5, max_len=6, n_best=3)
    (first, _, s1), (second, _, s2), (third, _, s3) = out.alternatives[0]
    assert first == [3] and s1 == pytest.approx(math.log(0.1), abs=1e-5)
    assert second == [4, 5, 6] and s2 == pytest.approx(math.log(0.9 * 0.24 * 0.3), abs=1e-5)
    assert third == [4, 5, 7] and s3 == pytest.approx(math.log(0.9 * 0.22 * 0.3), abs=1e-5)
    with pytest.raises(ValueError, match="n_best"):
        beam_search(dec, _images(1), beam_size=2, max_len=3, n_best=0)


def test_suppressed_unk_is_never_emitted_and_the_rest_is_renormalised():
    """The EARLY tree's best caption is [3] (<unk>, 0.1) under a wide beam; with <unk> suppressed its probability is
    renormalised away: the first word is 4 with p = 0.9 / 0.9 = 1, and greedy and beam 1 agree."""
    dec = TableDecoder(_prob_table(EARLY, DEEPER, 11), 11)
    out = decoding.beam_search(dec, _images(1), beam_size=5, max_len=6, n_best=3)  # suppress_unk: the default
    assert all(3 not in words for words, _, _ in out.alternatives[0])
    first, _, score = out.alternatives[0][0]
    assert first == [4, 5, 6]
    # log p of [4, 5, 6] then <end>: 1 (0.9 renormalised) x 1 x 0.24 x p(<end>) with <unk>'s 0.175 taken out
    assert score == pytest.approx(math.log(0.24) + math.log(0.3 / (1 - 0.175)), abs=1e-5)
    greedy = decoding.greedy_decode(dec, _images(1), max_len=6)
    one = decoding.beam_search(dec, _images(1), beam_size=1, max_len=6)
    assert greedy.tokens == one.tokens and 3 not in greedy.tokens[0]
    allowed = decoding.beam_search(dec, _images(1), beam_size=5, max_len=6, n_best=3, suppress_unk=False)
    assert allowed.alternatives[0][0][0] == [3]  # the same search with <unk> allowed picks it
