"""Test-time ensembles (captioning/models/ensemble.py): an ensemble of one model is the model bit for bit, two copies
of a model are the model, two different models decode the mean of their word distributions (checked on one step
by hand and on whole captions by teacher forcing), and what an ensemble cannot do is refused in one line."""

from __future__ import annotations

import copy
import math
import typing

import pytest
import torch
import yaml
from family import GRID, V, build
from fixtures import TINY_MODEL
from torch import nn

from captioning.base.decoding import ENSEMBLE_MEAN
from captioning.base.tokens import END_ID, START_ID
from captioning.config.schema import EnsembleConfig
from captioning.factory.models import build_captioner
from captioning.models.decoded import Decoded
from captioning.models.decoding import decode, special_ids, word_log_probs
from captioning.models.ensemble import MEANS, Ensemble, EnsembleStep, members_of, mix_log_probs
from captioning.models.rows import repeat_rows, select_rows
from captioning.runtime import CONF_DIR

SMALL_GRID = (3, 3)  # the second model's grid: another L than GRID's 4 x 5
SIZES = {"embed_dim": 16, "hidden_dim": 32, "d_model": 16, "ff_dim": 32}  # wide enough for captions to vary by image
SEARCHES = [pytest.param(1, 1, id="greedy"), pytest.param(3, 1, id="beam3"), pytest.param(3, 3, id="beam3-nbest3")]


def ending(dec: nn.Module, bias: float) -> nn.Module:
    """The decoder in eval mode with `bias` added to its <end> logit, so that captions end at different steps."""
    out = [m for m in dec.modules() if isinstance(m, nn.Linear) and m.out_features == V]
    assert len(out) == 1, "one output layer over the vocabulary"
    with torch.no_grad():
        out[0].bias[END_ID] += bias
    return dec.eval()


def annotations(L: int, seed: int, B: int = 6) -> torch.Tensor:
    """Annotation vectors a (B, L, D) varied enough that the captions differ between images."""
    g = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(B, L, 10, generator=g)


def varied_endings(kind: str, a: torch.Tensor, beam: int, n_best: int, shared: bool) -> tuple[nn.Module, Decoded]:
    """Decoder `kind` (seeded) with the first <end> bias of -0.5, -0.4, ..., 2.5 at which this search's captions end
    at different steps, so that rows drop out of the batch on the way; and its decoding."""
    for tenth in range(-5, 26):
        dec = ending(build(kind, "soft", **SIZES), tenth / 10)
        dec.rows_share_images = shared  # False: beam search gives every beam its own copy of a and the keys
        out = decode(dec, a, beam, 8, n_best=n_best, grid=GRID)
        if len({len(t) for t in out.tokens}) > 1:
            return dec, out
    pytest.fail(f"no <end> bias makes {kind}'s captions end at different steps")


def assert_identical(x: Decoded, y: Decoded) -> None:
    """The same captions, scores and maps, bit for bit (and the same alternatives)."""
    assert x.tokens == y.tokens
    assert torch.equal(x.scores, y.scores)
    assert all(torch.equal(p, q) for p, q in zip(x.alphas, y.alphas, strict=True))
    assert (x.alternatives is None) == (y.alternatives is None)
    for alts_x, alts_y in zip(x.alternatives or [], y.alternatives or [], strict=True):
        assert [(w, s) for w, _, s in alts_x] == [(w, s) for w, _, s in alts_y]
        assert all(torch.equal(p, q) for (_, p, _), (_, q, _) in zip(alts_x, alts_y, strict=True))


# -- one model, two copies -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sat", "luong", "updown", "transformer"])
@pytest.mark.parametrize("beam, n_best", SEARCHES)
@pytest.mark.parametrize("shared", [True, False], ids=["shared-rows", "copied-rows"])
def test_an_ensemble_of_one_is_the_model_bit_for_bit(kind, beam, n_best, shared):
    a = annotations(20, 0)
    dec, alone = varied_endings(kind, a, beam, n_best, shared)  # copied rows: the per-model keys are repeated too
    together = decode(EnsembleStep([dec], [a], [GRID]), a, beam, 8, n_best=n_best, grid=GRID)
    assert_identical(together, alone)


@pytest.mark.parametrize("mean", ["prob", "logprob"])
@pytest.mark.parametrize("beam, n_best", SEARCHES)
def test_two_copies_of_a_model_are_the_model(mean, beam, n_best):
    a = annotations(20, 0)
    dec, alone = varied_endings("sat", a, beam, n_best, shared=True)
    twice = decode(EnsembleStep([dec, dec], [a, a], [GRID, GRID], mean), a, beam, 8, n_best=n_best, grid=GRID)
    assert twice.tokens == alone.tokens
    assert all(torch.equal(p, q) for p, q in zip(twice.alphas, alone.alphas))  # model 0's maps, same history
    # log((p + p) / 2) and (log p + log p) / 2, renormalised, differ from log p by float32 rounding only
    torch.testing.assert_close(twice.scores, alone.scores, rtol=0, atol=1e-5)


def test_copies_on_one_captioner_generate_its_captions(tiny_model):
    tiny_model.eval()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    for beam in (1, 3):
        alone, grid = tiny_model.generate(images, beam, 6)
        one, one_grid = Ensemble([tiny_model]).generate(images, beam, 6)
        assert_identical(one, alone)
        assert one_grid == grid == (8, 8)
        two, _ = Ensemble([tiny_model, tiny_model]).generate(images, beam, 6)
        assert two.tokens == alone.tokens
        torch.testing.assert_close(two.scores, alone.scores, rtol=0, atol=1e-5)


# -- two different models -------------------------------------------------------------------------------------------
def pair(mean: str = "prob", maps_from: int = 0):
    """SAT over a 4 x 5 grid and Luong's decoder over another, 3 x 3 grid, of the same images, ensembled."""
    sat, luong = ending(build("sat", "soft", **SIZES), 0.8), ending(build("luong", "soft", **SIZES), 0.1)
    a1, a2 = annotations(20, 1), annotations(9, 2)
    step = EnsembleStep([sat, luong], [a1, a2], [GRID, SMALL_GRID], mean, maps_from)
    return sat, luong, a1, a2, step


def first_step(dec: nn.Module, a: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The model's own log word distribution (B, V) at step 0, as decoding masks it."""
    keys = dec.attention.prepare(a, grid, None)
    logits, _, _ = dec.step(torch.full((a.shape[0],), START_ID), dec.init_state(a), a, keys)
    return word_log_probs(logits, special_ids(a.device))


@pytest.mark.parametrize("mean", ["prob", "logprob"])
@torch.no_grad()
def test_one_step_is_the_mean_of_the_two_distributions(mean):
    sat, luong, a1, a2, step = pair(mean)
    keys = step.attention.prepare(a1, GRID, None)
    mixed, _, att = step.step(torch.full((6,), START_ID), step.init_state(a1), a1, keys)
    p1, p2 = first_step(sat, a1, GRID).exp(), first_step(luong, a2, SMALL_GRID).exp()  # (B, V) each
    if mean == "prob":
        expected = (p1 + p2) / 2
    else:  # the geometric mean, renormalised over the words
        geometric = (p1 * p2).sqrt()
        expected = geometric / geometric.sum(-1, keepdim=True)
    got = word_log_probs(mixed, special_ids(a1.device)).exp()  # what decoding makes of the step's output
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert float(got[:, START_ID].max()) == float(got[:, 0].max()) == 0.0  # <start> and <pad> never chosen
    assert att.alpha.shape == (6, 20)  # model 0's map
    assert not torch.allclose(got, p1, atol=1e-3) and not torch.allclose(got, p2, atol=1e-3)


def forced_log_probs(dec: nn.Module, a: torch.Tensor, seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher forcing of one image's caption: each step's log word distribution (T, V) and map (T, L)."""
    out = dec(a, torch.tensor([[START_ID, *seq]]))
    return word_log_probs(out.logits[0], special_ids(a.device)), out.alphas[0]


@pytest.mark.parametrize("mean", ["prob", "logprob"])
@pytest.mark.parametrize("beam", [1, 3])
def test_whole_captions_score_as_the_mixed_distribution_says(mean, beam):
    """Each caption's score is the sum of the mixed log-probabilities of its words under teacher forcing of both
    models, and its maps are model `maps_from`'s (here the second, on its own 3 x 3 grid)."""
    max_len = 7
    sat, luong, a1, a2, step = pair(mean, maps_from=1)
    out = decode(step, a2, beam, max_len, grid=SMALL_GRID)
    assert any(len(t) < max_len for t in out.tokens)  # some captions ended
    special = special_ids(a1.device)
    for i, toks in enumerate(out.tokens):
        seq = toks + [END_ID] if len(toks) < max_len else toks
        (lp1, _), (lp2, alpha2) = forced_log_probs(sat, a1[i:i + 1], seq), forced_log_probs(luong, a2[i:i + 1], seq)
        # the models' words mixed, then renormalised without <unk> as decoding does (eval.suppress_unk)
        mixed = word_log_probs(mix_log_probs([lp1, lp2], special, mean), special_ids(a1.device, True))  # (T, V)
        assert out.scores[i].item() == pytest.approx(mixed[torch.arange(len(seq)), seq].sum().item(), abs=1e-5)
        assert out.alphas[i].shape == (len(toks), 9)
        torch.testing.assert_close(out.alphas[i], alpha2[:len(toks)], rtol=0, atol=1e-5)
    for dec, a, grid in ((sat, a1, GRID), (luong, a2, SMALL_GRID)):  # the ensemble is neither model
        alone = decode(dec, a, beam, max_len, grid=grid)
        assert alone.tokens != out.tokens or not torch.allclose(alone.scores, out.scores, atol=1e-3)


def test_mix_of_one_distribution_is_that_distribution():
    logits = torch.randn(4, V)
    special = special_ids(logits.device)
    for mean in ("prob", "logprob"):
        torch.testing.assert_close(mix_log_probs([logits, logits], special, mean), word_log_probs(logits, special))
    assert math.isinf(float(mix_log_probs([logits, logits], special, "prob")[0, START_ID]))


# -- captioners: encoders, grids, refusals --------------------------------------------------------------------------
def other_captioner() -> nn.Module:
    """Another architecture on the same images: Luong's decoder, a deeper SmallCNN with a 4 x 4 grid at 32 px."""
    spec = copy.deepcopy(TINY_MODEL)
    spec["encoder"].update(channels=[8, 16, 16], num_pools=3)
    spec["decoder"] = {"_target_": "luong", "embed_dim": 16, "hidden_dim": 32, "dropout": 0.0}
    torch.manual_seed(1)
    return build_captioner(spec, 12).eval()


def test_models_of_other_encoders_and_decoders_caption_together(tiny_model):
    other = other_captioner()
    images = torch.randn(2, 3, 32, 32)
    ens = Ensemble([tiny_model.eval(), other], maps_from=1)
    decoded, grid = ens.generate(images, 3, 5, n_best=2)
    assert grid == (4, 4) and ens.encoder is other.encoder and ens.decoder is other.decoder
    assert all(alpha.shape == (len(t), 16) for t, alpha in zip(decoded.tokens, decoded.alphas))
    assert decoded.alternatives is not None and all(1 <= len(x) <= 2 for x in decoded.alternatives)
    assert members_of(ens) == [tiny_model, other] and members_of(tiny_model) == [tiny_model]


def test_what_an_ensemble_cannot_do_is_refused_in_one_line(tiny_model):
    other = other_captioner()
    cases = [(lambda: Ensemble([]), "at least one model"),
             (lambda: Ensemble([tiny_model], mean="median"), "must be one of prob, logprob"),
             (lambda: Ensemble([tiny_model, other], maps_from=2), "maps_from=2 names no model"),
             (lambda: Ensemble([tiny_model, other]).generate(torch.randn(2, 64, 32)), "decode from the images"),
             (lambda: Ensemble([tiny_model]).forward(torch.randn(1, 3, 32, 32), torch.ones(1, 3).long()),
              "only decodes"),
             (lambda: Ensemble([tiny_model]).encode(torch.randn(1, 3, 32, 32)), "one encoding per model")]
    resized, regions = copy.deepcopy(TINY_MODEL), copy.deepcopy(TINY_MODEL)
    resized["encoder"]["image_size"] = 48
    cases.append((lambda: Ensemble([tiny_model, build_captioner(resized, 12)]), "preprocesses images otherwise"))
    regions["encoder"] = {"_target_": "regions", "dim": 16}
    cases.append((lambda: Ensemble([tiny_model, build_captioner(regions, 12)]), "model 1 of the ensemble has "
                  "encoder=regions"))
    for make, words in cases:
        with pytest.raises((ValueError, TypeError)) as err:
            make()
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_ensemble_is_not_exported(tiny_model, tmp_path):
    pytest.importorskip("onnx")
    from captioning.data.vocab import Vocabulary
    from captioning.export.exporter import export_model

    vocab = Vocabulary.build([["a", "red", "circle", "b", "c", "d", "e", "f"]])
    with pytest.raises(ValueError, match="an ensemble cannot be exported") as err:
        export_model(Ensemble([tiny_model, tiny_model]), vocab, tmp_path / "out")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_rows_reach_every_tensor_of_nested_keys():
    x, y = torch.arange(6.0).view(3, 2), torch.arange(3)
    picked = select_rows(torch.tensor([2, 0]), ((x, y), (x, None)), None, y)
    assert torch.equal(picked[0][0][0], x[[2, 0]]) and picked[0][1][1] is None and picked[1] is None
    assert torch.equal(picked[0][0][1], torch.tensor([2, 0])) and torch.equal(picked[2], torch.tensor([2, 0]))
    repeated = repeat_rows(((x, y),), 2)
    assert torch.equal(repeated[0][1], torch.tensor([0, 0, 1, 1, 2, 2]))


def test_the_default_mean_is_written_once_and_the_config_offers_the_library_means():
    shipped = yaml.safe_load((CONF_DIR / "evaluate.yaml").read_text())["ensemble"]
    assert shipped == {"mean": ENSEMBLE_MEAN, "maps_from": 0}
    offered = typing.get_args(typing.get_type_hints(EnsembleConfig)["mean"])
    assert offered == MEANS and ENSEMBLE_MEAN in MEANS
