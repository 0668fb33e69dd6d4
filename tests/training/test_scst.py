"""Self-critical training (objective=scst): the reward is coco-caption's CIDEr-D, the advantages are the two
baselines', samples equal to the greedy caption give no gradient, the estimator's mean is the exact gradient of
the expected reward (an enumerable toy, soft and hard attention), and SCST runs with every attention, both
decoders, cached annotations, bf16 and init_from. Exact resume of an SCST run: tests/test_resume.py."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from family import refusal
from fixtures import TINY_ENCODER, TINY_MODEL, compose_config, tiny_overrides

from captioning.data.dataset import Batch, CaptionDataset, collate
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner, model_config
from captioning.metrics import CiderD, score_captions
from captioning.metrics.tokenizer import ptb_tokenize
from captioning.models.attention import HardAttention, SoftAttention
from captioning.models.captioner import Captioner
from captioning.models.decoders.sat import ShowAttendTellDecoder
from captioning.models.encoder import SmallCNN
from captioning.runtime import CONF_DIR
from captioning.train import train
from captioning.training.losses import MovingAverageBaseline, leave_one_out_baseline
from captioning.training.objectives import LossContext, SelfCritical, self_critical_baseline
from captioning.training.scst.rewards import CaptionReward
from captioning.training.scst.sampling import Samples, sample_captions

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/training/conftest.py


def _context(forward, model, samples_regions=False) -> LossContext:
    return LossContext(forward, model, torch.device("cpu"), None, MovingAverageBaseline(0.9), samples_regions)


# -- the reward ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def train_records(shapes_json):
    return read_karpathy(shapes_json, "train")


def _candidates(records):
    """A caption per image: a reference, one cut mid-phrase (a bad ending), another image's reference, nonsense."""
    out = []
    for i, r in enumerate(records):
        words = r.raw[0].split()
        out.append([words, words[:-1], records[(i + 1) % len(records)].raw[1].split(), ["circle"] * 3][i % 4])
    return out


def test_reward_is_coco_caption_cider_d_and_scores_the_end_token(train_records):
    refs = [r.raw for r in train_records]
    plain = CaptionReward(refs, end_token=False)
    cands = [" ".join(w) for w in _candidates(train_records)]
    ids = list(range(len(refs)))
    # One caption per training image: exactly coco-caption's CIDEr-D (its document frequencies are the same).
    coco = score_captions(dict(enumerate(cands)), dict(enumerate(refs)), metrics=["cider"], tokenizer="python")
    assert plain.cider_d(ids, cands).tolist() == [coco.per_image[i]["CIDEr"] for i in ids]
    # With the end token: CiderD on the same tokens, each caption and reference ending in one more word, <end>.
    with_end = CaptionReward(refs)
    tokens = ptb_tokenize(dict(enumerate(refs)))
    cider = CiderD({i: [t + " <end>" for t in tokens[i]] for i in ids})
    texts = [with_end.text(c.split(), ended=True) for c in cands]
    assert texts[0] == cands[0] + " <end>" and with_end.text(["a", "b"], ended=False) == "a b"  # cut at max_len
    got = with_end.cider_d(ids, texts)
    assert got.tolist() == cider.score_many(ids, texts).tolist()
    assert not np.allclose(got, plain.cider_d(ids, cands))
    # A bad ending (the reference without its last word) loses more of a reference's reward with the end token,
    # whose n-grams ("... a large <end>") match no reference.
    cut = np.arange(1, len(ids), 4)
    full = CaptionReward(refs).cider_d(cut.tolist(), [with_end.text(train_records[i].raw[0].split(), True) for i in cut])
    no_end_full = plain.cider_d(cut.tolist(), [train_records[i].raw[0] for i in cut])
    assert (got[cut] / full).mean() < (plain.cider_d(ids, cands)[cut] / no_end_full).mean()


def test_bleu4_and_mixed_rewards(train_records):
    refs = [r.raw for r in train_records]
    cands = [" ".join(w) for w in _candidates(train_records)]
    ids = list(range(len(refs)))
    coco = score_captions(dict(enumerate(cands)), dict(enumerate(refs)), metrics=["bleu", "cider"], tokenizer="python")
    bleu = CaptionReward(refs, cider_weight=0.0, bleu4_weight=1.0, end_token=False)
    scores = bleu.scores(ids, cands)
    assert scores["Bleu_4"].tolist() == [coco.per_image[i]["Bleu_4"] for i in ids]
    assert bleu(scores).tolist() == scores["Bleu_4"].tolist()
    mix = CaptionReward(refs, cider_weight=0.5, bleu4_weight=2.0, end_token=False)
    expected = [0.5 * coco.per_image[i]["CIDEr"] + 2.0 * coco.per_image[i]["Bleu_4"] for i in ids]
    np.testing.assert_allclose(mix(mix.scores(ids, cands)), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="not all 0"):
        CaptionReward(refs, cider_weight=0.0)


# -- baselines and the loss ------------------------------------------------------------------------------------
def test_advantages_of_both_baselines_by_hand():
    rewards = torch.tensor([0.5, 1.0, 2.0, 0.0, 3.0, 1.5])  # 2 images x 3 samples
    greedy = torch.tensor([1.0, 2.0])
    b = self_critical_baseline(rewards, greedy, "greedy", 3)
    assert (rewards - b).tolist() == [-0.5, 0.0, 1.0, -2.0, 1.0, -0.5]
    b = self_critical_baseline(rewards, greedy, "mean", 3)  # the mean of the image's two other samples
    assert b.tolist() == [1.5, 1.25, 0.75, 2.25, 0.75, 1.5]
    assert (rewards - b).tolist() == [-1.0, -0.25, 1.25, -2.25, 2.25, 0.0]
    with pytest.raises(ValueError, match=">= 2 samples"):
        leave_one_out_baseline(rewards, 1)
    with pytest.raises(ValueError, match="needs samples_per_image >= 2"):
        SelfCritical(baseline="mean", samples_per_image=1)
    with pytest.raises(ValueError, match="samples_per_image=0: must be >= 1"):
        SelfCritical(samples_per_image=0)


def test_loss_terms_of_a_hand_made_batch():
    theta = torch.zeros(4, 3, requires_grad=True)
    log_probs = (theta - torch.tensor([[0.5, 1.0, 2.0]])) * torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    samples = Samples(torch.zeros(4, 3, dtype=torch.long), log_probs, mask, torch.full((4, 3, 2), 0.5))
    rewards, b = torch.tensor([1.0, 0.0, 2.0, 0.5]), torch.tensor([0.5, 0.5, 1.0, 1.0])
    objective = SelfCritical(baseline="greedy", samples_per_image=2, entropy_weight=0.0)
    terms = objective.terms(samples, rewards, b, _context(None, None))
    seq = torch.tensor([-3.5, -1.5, -0.5, -3.5])  # sum_t log q(y_t) over each sample's steps
    adv = torch.tensor([0.5, -0.5, 1.0, -0.5])
    assert terms.total.item() == pytest.approx(-(adv * seq).mean().item())
    assert terms.nll.item() == pytest.approx(9.0 / 4) and terms.token_nll.item() == pytest.approx(9.0 / 9)
    terms.total.backward()  # d/d theta_nt = -adv_n / N at real steps
    torch.testing.assert_close(theta.grad, -adv[:, None] / 4 * mask)


# -- a small real model ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(train_records):
    """A tiny soft-attention captioner over the shapes vocabulary, a training split and an SCST objective on it."""
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in train_records for c in r.captions)
    model = build_captioner(TINY_MODEL, len(vocab))
    data = CaptionDataset(train_records, vocab, model.encoder.transform())
    return model, data


def _scst(data, **kw) -> SelfCritical:
    objective = SelfCritical(**{"samples_per_image": 3, "max_len": 8, "entropy_weight": 0.0, **kw})
    objective.prepare(data)
    return objective


@pytest.mark.parametrize("baseline", ["greedy", "mean"])
def test_samples_equal_to_the_greedy_caption_give_a_zero_gradient(tiny, monkeypatch, baseline):
    model, data = tiny
    model.train()
    objective = _scst(data, baseline=baseline)
    batch = collate([data[i] for i in range(4)])
    # cached annotations (no BatchNorm): train and eval mode compute the same policy
    a = torch.randn(4, 16, model.encoder.out_dim)
    batch.images = a
    ctx = _context(objective.wrap(model), model)
    monkeypatch.setattr(torch, "multinomial", lambda probs, n: probs.argmax(dim=1, keepdim=True))  # the mode
    terms, stats = objective.loss(ctx, batch)
    assert stats["reward"] == pytest.approx(stats["greedy_CIDEr"]) and stats["reward"] > 0  # every sample is greedy's
    model.zero_grad()
    terms.total.backward()
    grads = [p.grad for p in model.decoder.parameters() if p.grad is not None]
    if baseline == "greedy":  # r - b is 0.0 exactly: the same caption, the same CIDEr-D
        assert stats["advantage"] == 0.0 and grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    else:  # the mean of the other samples: r - (r + r) / 2, 0 up to float rounding
        assert abs(stats["advantage"]) < 1e-7 and grads and all(g.abs().max() < 1e-6 for g in grads)
    monkeypatch.undo()
    torch.manual_seed(1)
    terms, stats = objective.loss(ctx, batch)  # real samples: some differ, and the gradient is not zero
    model.zero_grad()
    terms.total.backward()
    assert stats["advantage"] != 0.0 or baseline == "mean"
    assert any(p.grad.abs().sum() > 0 for p in model.decoder.parameters() if p.grad is not None)


# -- the estimator on an enumerable toy -----------------------------------------------------------------------
WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "b"]  # sampled: <end>, <unk>, a, b
L, D, T = 4, 6, 2  # a 2 x 2 grid; captions of at most 2 tokens (words and <end>)


class TableReward:
    """A reward per caption text, in the CaptionReward interface."""

    def __init__(self):
        self.table = {}
        rng = np.random.default_rng(0)
        for y in _sequences():
            self.table[self.text([WORDS[w] for w in y if w != 2], 2 in y)] = float(rng.uniform(0, 3))

    def text(self, words, ended):
        return " ".join(words) + (" ." if ended else "")

    def scores(self, images, captions):
        return {"CIDEr": np.array([self.table[c] for c in captions])}

    def __call__(self, scores):
        return scores["CIDEr"]


def _sequences():
    """Every caption of at most T tokens over <end>, <unk>, a, b."""
    out = [(2,)]
    for w in (3, 4, 5):
        out += [(w, 2)] + [(w, v) for v in (3, 4, 5)]
    return out


def _toy(hard: bool) -> Captioner:
    torch.manual_seed(3)
    att = functools.partial(HardAttention, expected_context_prob=0.0) if hard else SoftAttention
    decoder = ShowAttendTellDecoder(len(WORDS), D, functools.partial(att, attention_dim=5), embed_dim=4,
                                    hidden_dim=8, dropout=0.0)
    model = Captioner(SmallCNN(channels=(D,), num_pools=0), decoder)
    model.train()
    return model


def _forced(draws: dict[str, torch.Tensor]):
    """torch.multinomial returning given draws: regions (rows, T) for (N, L) inputs, words (rows, T) for (N, V)."""
    calls = {"region": 0, "word": 0}

    def multinomial(probs, n):
        kind = "region" if probs.shape[1] == L else "word"
        t, calls[kind] = calls[kind], calls[kind] + 1
        return draws[kind][:, t : t + 1]
    return multinomial


def _exact_gradient(model, a, reward, hard, monkeypatch):
    """grad of E[r] = sum over every path (regions s, words y) of q(s, y) r(y), enumerated."""
    paths = []  # (words (T,), regions (T,))
    for y in _sequences():
        for s in itertools.product(range(L), repeat=len(y) if hard else 0):
            paths.append((list(y) + [2] * (T - len(y)), list(s) + [0] * (T - len(s)) if hard else [0] * T))
    words, regions = (torch.tensor([p[k] for p in paths]) for k in (0, 1))
    with monkeypatch.context() as m:
        m.setattr(torch, "multinomial", _forced({"word": words, "region": regions}))
        out = sample_captions(model.decoder, a, None, len(paths), T)
    assert torch.equal(out.tokens, words.masked_fill(~out.mask, 0))
    log_q = out.log_probs.sum(1) + (out.region_log_probs * out.mask).sum(1) if hard else out.log_probs.sum(1)
    assert log_q.exp().sum().item() == pytest.approx(1.0, abs=1e-5)  # every path, once
    texts = [reward.text([WORDS[w] for w in row if w > 2], 2 in row) for row in out.tokens.tolist()]
    model.zero_grad()
    (log_q.exp() * torch.tensor(reward.scores(None, texts)["CIDEr"], dtype=torch.float32)).sum().backward()
    return _watched(model)


def _watched(model):
    """The gradient of the output layer and the attention score vector: words' and regions' policies."""
    return torch.cat([model.decoder.L_o.weight.grad.flatten(), model.decoder.attention.w.weight.grad.flatten()])


@pytest.mark.parametrize("hard, baseline", [(False, "greedy"), (False, "mean"), (True, "greedy"), (True, "mean")])
def test_the_estimator_is_unbiased_for_the_exact_gradient_of_the_expected_reward(hard, baseline, monkeypatch):
    model = _toy(hard)
    torch.manual_seed(4)
    a = torch.randn(1, L, D)
    reward = TableReward()
    exact = _exact_gradient(model, a, reward, hard, monkeypatch)
    objective = SelfCritical(baseline=baseline, samples_per_image=4, max_len=T, entropy_weight=0.0)
    objective.vocab, objective.reward = Vocabulary(WORDS), reward
    images, ctx = a.expand(500, L, D), _context(objective.wrap(model), model, samples_regions=hard)
    batch = collate([{"image": a[0], "captions": [torch.tensor([1, 2])], "index": 0}] * 500)
    batch.images = images
    torch.manual_seed(5)
    estimates = []
    for _ in range(24):  # 24 estimates from 2000 sampled paths each
        model.zero_grad()
        terms, _ = objective.loss(ctx, batch)
        terms.total.backward()  # a loss: its negative gradient estimates grad E[r]
        estimates.append(-_watched(model))
    est = torch.stack(estimates)
    stderr = est.std(0) / est.shape[0] ** 0.5
    assert (est.mean(0) - exact).abs().le(4 * stderr + 1e-4).all(), (est.mean(0), exact, stderr)
    assert torch.nn.functional.cosine_similarity(est.mean(0), exact, dim=0) > 0.95
    if hard:  # the regions' REINFORCE term ran, with its own moving-average baseline
        assert ctx.baseline.value is not None


# -- every attention and decoder, cached annotations, bf16 ----------------------------------------------------
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
DECODERS = sorted(p.stem for p in (CONF_DIR / "decoder").glob("*.yaml"))
SMALL = ["attention.attention_dim=8", "attention.head_dim=4", "attention.num_heads=2", "attention.predictor_dim=8",
         "attention.num_filters=4", "attention.expected_context_prob=0.0", "decoder.embed_dim=8",
         "decoder.hidden_dim=16", "decoder.d_model=8", "decoder.num_heads=2", "decoder.ff_dim=16", *TINY_ENCODER]


# Every (attention, decoder) pair a decoder takes (a Transformer layer refuses hard, location, monotonic and mean
# attention: tests/models/test_decoders.py) with the greedy baseline; the mean baseline with soft attention for every
# decoder, and with hard and multi-head attention for the new ones (the other mean cases are the tests above).
SCST_CASES = [(a, d, b) for d in DECODERS for a in ATTENTIONS for b in ("greedy", "mean")
              if refusal(d, a) is None
              and (b == "greedy" or a == "soft" or (d in ("updown", "transformer") and a in ("hard", "multihead")))]


@pytest.mark.parametrize(("attention", "decoder", "baseline"), SCST_CASES)
def test_every_attention_and_decoder_trains_with_scst(tiny, attention, decoder, baseline):
    _, data = tiny
    cfg = compose_config(f"attention={attention}", f"decoder={decoder}", "objective=scst")
    spec = model_config(cfg)
    for key in SMALL:  # only the keys this attention / decoder takes
        group, name, value = key.split(".")[0], key.split(".")[1].split("=")[0], key.split("=")[1]
        if name in spec[group]:
            spec[group][name] = json.loads(value)
    torch.manual_seed(0)
    model = build_captioner(spec, len(data.vocab))
    model.train()
    objective = _scst(data, baseline=baseline, entropy_weight=0.002)
    batch = collate([data[i] for i in range(3)])
    ctx = _context(objective.wrap(model), model, samples_regions=isinstance(model.decoder.attention, HardAttention))
    model.decoder.attention.begin_batch()
    terms, stats = objective.loss(ctx, batch)
    terms.total.backward()
    assert torch.isfinite(terms.total) and 0 < stats["sample_length"] <= 8
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing  # every parameter gets a gradient from the sampled captions
    if attention == "hard":
        assert terms.policy is not None and terms.entropy is not None and ctx.baseline.value == stats["reward"]


def test_cached_annotations_and_bf16(tiny):
    model, data = tiny
    model.train()
    objective = _scst(data)
    batch = collate([data[i] for i in range(4)])
    cached = Batch(model.encode(batch.images)[0].detach(), batch.captions, batch.image_index, batch.indices)
    runs = {}
    for name, b, dtype in (("images", batch, None), ("cached", cached, None), ("bf16", cached, torch.bfloat16)):
        ctx = LossContext(objective.wrap(model), model, torch.device("cpu"), dtype, MovingAverageBaseline(), False)
        torch.manual_seed(6)
        runs[name] = objective.loss(ctx, b)
    (images, s_images), (cached_terms, s_cached), (low, s_low) = runs["images"], runs["cached"], runs["bf16"]
    # a feature cache holds what the encoder computes: the same samples, rewards and loss
    assert torch.equal(images.total, cached_terms.total) and s_images["reward"] == s_cached["reward"]
    assert low.total.dtype == torch.float32 and torch.isfinite(low.total)
    model.zero_grad()
    low.total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.decoder.parameters() if p.grad is not None)
    # bf16 draws from nearly the same policy: with the same random numbers, nearly the same captions
    torch.manual_seed(7)
    full = objective.wrap(model)(cached.images)
    torch.manual_seed(7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = objective.wrap(model)(cached.images)
    steps = min(full.tokens.shape[1], half.tokens.shape[1])
    assert (full.tokens[:, :steps] == half.tokens[:, :steps]).float().mean() > 0.8
    assert s_low["sample_length"] == pytest.approx(s_cached["sample_length"], rel=0.25)


# -- end to end ---------------------------------------------------------------------------------------------------
def _tiny_run(shapes_json, *extra):
    return compose_config(*tiny_overrides(Path(shapes_json).parent, "eval.num_figures=0", "eval.report=false", "device=cpu",
                                    *extra))


def test_scst_run_from_a_cross_entropy_checkpoint(shapes_json, tmp_path, monkeypatch):
    monkeypatch.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)
    train(_tiny_run(shapes_json, "trainer.max_epochs=1"), tmp_path / "xe")
    best = tmp_path / "xe/checkpoints/best.pt"
    cfg = _tiny_run(shapes_json, "objective=scst", f"init_from={best}", "trainer.max_epochs=2", "objective.max_len=8",
                    "objective.samples_per_image=2", "trainer.precision=bf16")
    assert cfg.optim.lr == 5e-5 and cfg.trainer.monitor == "CIDEr"  # the preset's settings
    train(cfg, tmp_path / "scst")
    history = json.loads((tmp_path / "scst/history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    for h in history:  # per-epoch means of what each step logged
        assert {"reward", "reward_baseline", "advantage", "sample_CIDEr", "greedy_CIDEr", "sample_length"} <= h.keys()
        assert h["reward"] == pytest.approx(h["sample_CIDEr"]) and abs(h["advantage"]) < 1e-6  # mean baseline
    start = torch.load(best, weights_only=True)["model"]
    last = torch.load(tmp_path / "scst/checkpoints/last.pt", weights_only=True)
    assert last["epoch"] == 2 and last["step"] == 12  # 48 images in batches of 8, twice
    assert last["optimizer"]["state"][0]["step"] == 12  # a fresh optimizer: Adam has taken this run's steps only
    assert any(not torch.equal(start[k], last["model"][k]) for k in start)
    # a checkpoint of another model is refused, naming what to do
    other = _tiny_run(shapes_json, "objective=scst", f"init_from={best}", "decoder.hidden_dim=16")
    with pytest.raises(ValueError, match="cannot init_from .* different model config"):
        train(other, tmp_path / "other")


@pytest.mark.integration
@pytest.mark.slow
def test_scst_under_torchrun_with_two_ranks(shapes_json, tmp_path):
    """2 processes (gloo, CPU): each rank samples, scores and baselines its own images; DDP averages gradients."""
    from test_distributed import _overrides, _torchrun

    xe_cfg = compose_config(*_overrides(shapes_json, "dataset.batch_size=8", "device=cpu"))
    train(xe_cfg, tmp_path / "xe")
    for attention in ("soft", "hard"):
        extra = ["attention=hard", "attention.expected_context_prob=0.0"] if attention == "hard" else []
        if attention == "hard":
            train(compose_config(*_overrides(shapes_json, "dataset.batch_size=8", "device=cpu", *extra)),
                  tmp_path / "xe_hard")
        xe = tmp_path / ("xe_hard" if attention == "hard" else "xe")
        run = tmp_path / f"scst_{attention}"
        _torchrun(2, _overrides(shapes_json, "dataset.batch_size=4", "objective=scst", "objective.max_len=8",
                                f"init_from={xe / 'checkpoints/best.pt'}", f"hydra.run.dir={run}", *extra),
                  tmp_path / f"launch_{attention}")
        (h,) = json.loads((run / "history.json").read_text())
        assert h["step"] == 48 // 8 and h["reward"] > 0 and abs(h["advantage"]) < 1e-6
        assert json.loads((run / "metrics.json").read_text())["num_images"] == 12
        if attention == "hard":  # the regions' baseline is the global batch's, the same on both ranks
            assert "policy" in h and h["baseline"] > 0
