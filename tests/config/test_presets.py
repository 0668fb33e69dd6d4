"""The paper presets carry the EFFECTIVE constants of the authors' arctic-captions code (commit f4565bf), as the
table in experiments/README.md ("Fidelity") lists them: optimiser state and steps, batches of 64 captions, and
the loss's effective weights, checked against the authors' formulas written out by hand (capgen.py line numbers)."""

import math
from types import SimpleNamespace

import pytest
import torch
from fixtures import compose_config
from hydra.utils import instantiate
from omegaconf import OmegaConf

from captioning.data.dataset import Batch, CaptionDataset, CaptionPairs, collate, collate_pairs, training_view
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.factory import registry
from captioning.models.attention import HardAttention, SoftAttention
from captioning.models.decoders.base import DecoderOutput
from captioning.training.losses import MovingAverageBaseline
from captioning.training.trainer import Trainer

PAPER = ["coco_hard", "coco_soft", "coco_soft_resnet101", "flickr30k_hard", "flickr30k_soft", "flickr8k_hard",
         "flickr8k_soft"]


def _optimizer(cfg, param):
    return instantiate(cfg.optim)([param])


@pytest.mark.parametrize("preset", PAPER)
def test_optimiser_batches_and_schedule(preset):
    cfg = compose_config(f"experiment={preset}")
    group = _optimizer(cfg, torch.nn.Parameter(torch.zeros(1))).param_groups[0]
    if preset.startswith("flickr8k"):  # optimizers.py:L57-73: centred RMSprop, decay 0.95, momentum 0.9, step 1e-4
        assert cfg.optim._target_ == "torch.optim.RMSprop"
        assert (group["lr"], group["alpha"], group["momentum"], group["centered"]) == (1e-4, 0.95, 0.9, True)
        assert group["eps"] == 1e-2 and group["weight_decay"] == 0  # eps: the floor sqrt(1e-4) of L69
    else:  # optimizers.py:L78-108: Adam, lr0 2e-4, b1 = 1 - beta1 = 0.1, b2 = 1 - beta2 = 0.001, e = 1e-8
        assert cfg.optim._target_ == "torch.optim.Adam"
        assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (2e-4, (0.9, 0.999),
                                                                                            1e-8, 0)
    assert cfg.dataset.batch_unit == "captions" and cfg.dataset.batch_size == 64  # evaluate_coco.py:L39
    assert cfg.dataset.captions_per_image is None
    assert cfg.trainer.grad_clip is None and not cfg.scheduler.get("_target_")  # no clipping, constant step
    assert cfg.decoder.dropout == 0.5 and cfg.objective.attention_weight == 1.0  # evaluate_coco.py:L67, L73
    rc = cfg.objective
    assert (rc.reward_weight, rc.entropy_weight, rc.baseline_decay, rc.num_samples) == (0.1, 0.002, 0.9, 1)


def test_defaults_keep_this_projects_normalisation():
    cfg = compose_config()
    rc = cfg.objective
    assert cfg.dataset.batch_unit == "images" and rc.attention_reduction == "caption_mean"
    assert (rc.reward, rc.reduction, rc.doubly_stochastic, rc.every_batch) == ("sum", "mean", True, False)
    dc = cfg.decoder  # and this project's decoder: none of arctic-captions' additions
    assert (cfg.attention.attention_layers, dc.init_layers, dc.init_activation) == (1, 1, "tanh")
    assert (dc.dropout, dc.hidden_dropout, dc.init_dropout) == (0.1, 0.0, 0.0)


@pytest.mark.parametrize("preset", PAPER)
def test_the_decoder_is_arctic_captions_coco_model(preset):
    """evaluate_coco.py:L57-63 (the only released script; the Flickr presets reuse it) and capgen.py's dropout."""
    cfg = compose_config(f"experiment={preset}")
    dc = cfg.decoder
    assert (dc.embed_dim, dc.hidden_dim, cfg.attention.attention_dim) == (512, 1800, 512)  # L57-59
    assert cfg.attention.attention_layers == 2  # n_layers_att, L60: tanh(W k + b) on the keys, capgen.py:L357-362
    assert (dc.init_layers, dc.init_activation) == (2, "relu")  # n_layers_init, L63; capgen.py:L627-629
    # use_dropout (L73): after the deep output's tanh, on h_t before it, on the init MLP's hidden layer
    assert (dc.dropout, dc.hidden_dropout, dc.init_dropout) == (0.5, 0.5, 0.5)  # capgen.py:L685, L674, L630


def _authors_rmsprop(grads, lr=1e-4):
    """optimizers.py:L62-70 in plain Python: returns the parameter and each step's denominator."""
    rg = rg2 = ud = p = 0.0
    dens = []
    for g in grads:
        rg, rg2 = 0.95 * rg + 0.05 * g, 0.95 * rg2 + 0.05 * g * g
        dens.append(math.sqrt(rg2 - rg * rg + 1e-4))
        ud = 0.9 * ud - lr * g / dens[-1]
        p += ud
    return p, dens


def test_rmsprop_matches_the_authors_recursion_up_to_the_eps_placement():
    cfg = compose_config("experiment=flickr8k_soft")
    torch.manual_seed(0)
    for scale in (1e-4, 1.0, 100.0):  # gradients far below, near and far above the eps floor
        grads = (scale * torch.randn(300)).tolist()
        param = torch.nn.Parameter(torch.zeros(1))
        opt = _optimizer(cfg, param)
        _, dens = _authors_rmsprop(grads)
        for g, den in zip(grads, dens):
            param.grad = torch.tensor([g])
            opt.step()
            state = opt.state[param]
            torch_den = math.sqrt(max(state["square_avg"].item() - state["grad_avg"].item() ** 2, 0)) + 1e-2
            assert den <= torch_den * (1 + 1e-5) and torch_den <= math.sqrt(2) * den * (1 + 1e-5)
    # Far above the floor the two are the same optimiser.
    grads = (100.0 * torch.randn(300, dtype=torch.float64)).tolist()
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = _optimizer(cfg, param)
    for g in grads:
        param.grad = torch.tensor([g], dtype=torch.float64)
        opt.step()
    assert param.item() == pytest.approx(_authors_rmsprop(grads)[0], rel=2e-3)


def test_adam_differs_from_the_authors_only_in_the_first_steps():
    cfg = compose_config("experiment=coco_soft")
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = _optimizer(cfg, param)
    m = v = 0.0
    ratios = []
    for t in range(1, 6001):  # a constant gradient of 1
        m, v = 0.1 + 0.9 * m, 0.001 + 0.999 * v  # optimizers.py:L97-98
        authors_step = 2e-4 * math.sqrt(1 - 0.001 ** t) / (1 - 0.1 ** t) * m / (math.sqrt(v) + 1e-8)  # L90-100
        before = param.item()
        param.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
        ratios.append(authors_step / (before - param.item()))
    assert ratios[0] == pytest.approx(math.sqrt(0.999) / 0.9 * 0.1 / math.sqrt(0.001), rel=1e-4)  # 3.51
    assert 6.5 < max(ratios) < 6.7 and ratios.index(max(ratios)) + 1 in range(10, 15)
    assert abs(ratios[-1] - 1) < 0.005  # after ~5000 updates torch's bias correction has faded too


def _trainer(cfg, attention, out: DecoderOutput, baseline: float | None) -> Trainer:
    """A Trainer with only what Trainer.loss reads: the preset's trainer section, its attention, a fixed forward."""
    trainer = object.__new__(Trainer)
    trainer.tc, trainer.device, trainer.amp_dtype = cfg.trainer, torch.device("cpu"), None
    trainer.objective = registry.build("objective", OmegaConf.to_container(cfg.objective))  # the preset's terms
    trainer.model = SimpleNamespace(decoder=SimpleNamespace(attention=attention))
    trainer.forward_model = lambda images, captions, image_index, lengths=None, mask=None: out
    trainer.baseline = MovingAverageBaseline(cfg.objective.baseline_decay)
    trainer.baseline.value = baseline
    return trainer


def _batch(n=3, words=3, vocab=9):
    """n captions of one length (as in the authors' length-homogeneous batches): <start> w w w <end>."""
    torch.manual_seed(3)
    captions = torch.cat([torch.full((n, 1), Vocabulary.start_id), torch.randint(4, vocab, (n, words)),
                          torch.full((n, 1), Vocabulary.end_id)], dim=1)  # (N, T+1)
    return Batch(torch.zeros(n, 1, 1), captions, torch.arange(n), list(range(n)))


def _leaves(n, steps, regions=5, vocab=9):
    logits = torch.randn(n, steps, vocab, requires_grad=True)  # (N, T, V)
    alphas = torch.softmax(torch.randn(n, steps, regions), -1).requires_grad_()  # (N, T, L)
    return logits, alphas


def _authors_nll(logits, targets):
    """-log p(y_t) per caption and step, (T, N) as capgen.py:L701-703 lays it out."""
    return -torch.log_softmax(logits, -1).gather(2, targets.unsqueeze(-1)).squeeze(-1).t()


@pytest.mark.parametrize("preset", ["coco_soft", "flickr8k_soft"])
def test_soft_loss_is_the_authors_cost(preset):
    cfg = compose_config(f"experiment={preset}")
    batch = _batch()
    logits, alphas = _leaves(3, 4)
    out = DecoderOutput(logits, alphas, torch.ones(3, 4))
    terms = _trainer(cfg, SoftAttention(4, 4, 4), out, None).loss(batch)
    a = alphas.transpose(0, 1)  # (T, N, L)
    cost = _authors_nll(logits, batch.captions[:, 1:]).sum(0).mean()  # L704, L1164
    cost = cost + 1.0 * ((1.0 - a.sum(0)) ** 2).sum(0).mean()  # L1177: summed over captions, mean over regions
    torch.testing.assert_close(terms.total, cost)
    # In this project's units the authors' lambda is alpha_c N / L = 3 / 5 here (64 / 196 with the presets).
    assert terms.attention_reg.item() == pytest.approx(3 / 5 * ((1 - alphas.sum(1)) ** 2).sum(1).mean().item())


@pytest.mark.parametrize("sampled", [True, False])
def test_hard_gradients_are_the_authors_known_grads(sampled):
    cfg = compose_config("experiment=coco_hard")
    batch, n, steps = _batch(), 3, 4
    targets = batch.captions[:, 1:]
    logits, alphas = _leaves(n, steps)
    attention = HardAttention(4, 4, 4)
    samples = torch.multinomial(alphas.detach().reshape(-1, 5), 1).reshape(n, steps)  # s_t (N, T)
    log_probs = torch.log(alphas.gather(2, samples.unsqueeze(-1)).squeeze(-1)) if sampled else None  # (N, T)
    entropies = -torch.special.xlogy(alphas, alphas).sum(-1) if sampled else None  # (N, T)
    out = DecoderOutput(logits, alphas, torch.ones(n, steps), log_probs, entropies)
    b_nll = 2.5  # the authors' baseline_time (a mean per-token NLL); this project's b is its negative
    trainer = _trainer(cfg, attention, out, -b_nll)
    trainer.loss(batch).total.backward()

    nll = _authors_nll(logits.detach(), targets)  # (T, N)
    alpha_entropy_c = 0.002  # capgen.py:L1077
    # capgen.py:L1194-1195 (RL_sumCost=True), in (N, T, L): the gradient the authors impose on the alphas.
    one_hot = torch.nn.functional.one_hot(samples, 5).to(alphas.dtype) if sampled else alphas.detach()
    advantage = (b_nll - nll.mean(0))[:, None, None] / 10.0  # masked_cost.mean(0): over the (padded) length
    known = advantage * (-one_hot / alphas.detach()) + alpha_entropy_c * (torch.log(alphas.detach()) + 1)
    if not sampled:  # the expected context: the REINFORCE part is constant over regions, zero through the softmax
        known = alpha_entropy_c * (torch.log(alphas.detach()) + 1)
    torch.testing.assert_close(alphas.grad, known)  # no doubly stochastic gradient: known_grads replaces it
    expected_logits = logits.detach().requires_grad_()
    _authors_nll(expected_logits, targets).sum(0).mean().backward()  # L1164: the NLL is a mean over captions
    torch.testing.assert_close(logits.grad, expected_logits.grad)
    # L1202: baseline_time <- 0.9 baseline_time + 0.1 masked_cost.mean(), in every minibatch.
    assert trainer.baseline.value == pytest.approx(-(0.9 * b_nll + 0.1 * nll.mean().item()))


def test_caption_batches_visit_every_caption_once_and_encode_each_image_once(shapes_json):
    records = read_karpathy(shapes_json, "train")[:3]
    records[2].captions = records[2].captions[:1]  # 5 + 5 + 1 captions
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    images = CaptionDataset(records, vocab, lambda im: torch.tensor(im.size, dtype=torch.float))
    pairs, collate_fn = training_view(images, "captions")
    assert isinstance(pairs, CaptionPairs) and collate_fn is collate_pairs and len(pairs) == 11
    assert training_view(images, "images") == (images, collate)
    seen = []
    for batch in torch.utils.data.DataLoader(pairs, batch_size=4, shuffle=True, collate_fn=collate_fn):
        assert batch.captions.shape[0] <= 4 and len(set(batch.indices)) == len(batch.indices)
        assert batch.images.shape[0] == len(batch.indices) == int(batch.image_index.max()) + 1
        for cap, i in zip(batch.captions, batch.image_index):
            seen.append((batch.indices[i], tuple(cap[cap != Vocabulary.pad_id].tolist())))
    expected = [(i, tuple(c.tolist())) for i, caps in enumerate(images.encoded) for c in caps]
    assert sorted(seen) == sorted(expected)
    merged = collate_pairs([pairs[0], pairs[7], pairs[1]])  # image 0, image 1, image 0 again
    assert merged.indices == [0, 1] and merged.image_index.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="captions_per_image=null"):
        CaptionPairs(CaptionDataset(records, vocab, lambda im: im, captions_per_image=2))
