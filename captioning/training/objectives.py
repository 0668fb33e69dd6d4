"""Training objectives (conf/objective/, a `_target_` group): what the loss of one minibatch is.

- `CrossEntropy` (objective=xe, the default): teacher-forced caption NLL and the doubly stochastic term, with hard
  attention's REINFORCE terms for its sampled regions; the paper's training.
- `SelfCritical` (objective=scst): self-critical sequence training (Rennie et al. 2017), from a cross-entropy
  checkpoint (init_from=PATH). Per image it samples n captions (captioning/training/scst/sampling.py), scores
  each with CIDEr-D against the image's training references (scst/rewards.py, end token included), and
  minimises -mean_n (r_n - b_n) sum_t log q(y_nt): the score-function estimate of the gradient of the expected
  reward. The baseline b is the reward of the greedy caption, decoded as at test time (`greedy`, Rennie et al.),
  or the mean reward of the image's other samples (`mean`, Luo 2020). With hard attention the regions are part
  of the sampled path: their REINFORCE term gets the same reward with hard attention's own moving-average
  baseline (`baseline_decay`), weighted by `region_weight`, plus the entropy term.

The terms both share are arguments of each (conf/objective/_terms.yaml, which xe.yaml and scst.yaml extend): the
doubly stochastic term (`attention_weight`, `attention_reduction`, `doubly_stochastic`) and hard attention's
entropy bonus and moving-average baseline (`entropy_weight`, `baseline_decay`, which the trainer reads).

The trainer calls `loss(ctx, batch)` with a `LossContext`, and logs the dict returned beside the loss terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from torch import nn

from captioning.base.constraints import Range, Size, Weight, constrained
from captioning.data.vocab import Vocabulary
from captioning.models.packing import prefix_lengths
from captioning.training import precision, randomness
from captioning.training.losses import (
    AttentionReduction,
    LossTerms,
    MovingAverageBaseline,
    Reduction,
    Reward,
    doubly_stochastic,
    hard_attention_loss,
    leave_one_out_baseline,
    reinforce_loss,
)
from captioning.training.scst.rewards import CaptionReward
from captioning.training.scst.sampling import CaptionSampler, Samples

if TYPE_CHECKING:
    from captioning.data.dataset import Batch, CaptionDataset

Decay = Annotated[float, Range(ge=0, lt=1)]
Baseline = Literal["greedy", "mean"]


@dataclass
class LossContext:
    """What an objective needs from the trainer for one minibatch."""

    forward: Any  # objective.wrap(model), or the DDP wrapper around it: gradients flow through it
    model: Any  # the plain Captioner (greedy decoding)
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype of the forward pass (None: float32)
    baseline: MovingAverageBaseline  # hard attention's moving-average baseline of its sampled regions
    samples_regions: bool  # the attention samples regions (hard attention)


class CrossEntropy:
    """objective=xe: maximum likelihood of the reference captions (teacher forcing), as the paper trains.

    attention_weight: lambda of the doubly stochastic term sum_i (1 - sum_t alpha_ti)^2, reduced as
    `attention_reduction` says (captioning/training/losses.py); with attention that samples regions (attention=hard) the
    REINFORCE terms of the paper's lower bound: `reward_weight` (lambda_r), `entropy_weight` (lambda_e), the
    moving-average baseline's `baseline_decay`, `num_samples` attention paths per caption, the `reward` and the
    `reduction` over captions, `doubly_stochastic` (false: lambda's term does not train such attention) and
    `every_batch` (entropy term and baseline update also in the expected-context minibatches).
    """

    fine_tunes = False  # trains from scratch

    @constrained
    def __init__(self, attention_weight: Weight = 0.0, attention_reduction: AttentionReduction = "caption_mean",
                 reward_weight: Weight = 0.1, entropy_weight: Weight = 0.002, baseline_decay: Decay = 0.9,
                 num_samples: Size = 1, reward: Reward = "sum", reduction: Reduction = "mean",
                 doubly_stochastic: bool = True, every_batch: bool = False):
        self.attention_weight, self.attention_reduction = attention_weight, attention_reduction
        self.reward_weight, self.entropy_weight, self.baseline_decay = reward_weight, entropy_weight, baseline_decay
        self.num_samples, self.reward, self.reduction = num_samples, reward, reduction
        self.doubly_stochastic, self.every_batch = doubly_stochastic, every_batch

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the loss runs its forward pass through: the captioner itself."""
        return model

    def prepare(self, train: CaptionDataset) -> None:
        """Nothing to read from the training split."""

    def loss(self, ctx: LossContext, batch: Batch) -> tuple[LossTerms, dict[str, float]]:
        """Teacher-forced NLL (+ the doubly stochastic term, + REINFORCE terms when attention samples regions)."""
        captions, image_index = batch.captions, batch.image_index
        if self.num_samples > 1:  # N sampled attention paths per caption
            captions, image_index = captions.repeat(self.num_samples, 1), image_index.repeat(self.num_samples)
        lengths = prefix_lengths(captions[:, 1:], Vocabulary.pad_id)  # real words only (None: run every step)
        with precision.autocast(ctx.device, ctx.amp_dtype):
            out = ctx.forward(batch.images, captions, image_index, lengths, batch.mask)
        f32 = precision.to_float32  # the loss runs in float32 whatever dtype the forward pass ran in
        terms = hard_attention_loss(
            out.logits.float(), captions[:, 1:], out.alphas.float(), f32(out.log_probs), f32(out.entropies),
            Vocabulary.pad_id, ctx.baseline, self.attention_weight, self.reward_weight, self.entropy_weight,
            attention_reduction=self.attention_reduction, reward=self.reward, reduction=self.reduction,
            samples_regions=ctx.samples_regions, doubly_stochastic_term=self.doubly_stochastic,
            every_batch=self.every_batch, region_mask=None if batch.mask is None else batch.mask[image_index])
        return terms, {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless."""


@torch.no_grad()
def greedy_captions(model: Any, images: torch.Tensor, max_len: int,
                    mask: torch.Tensor | None = None) -> list[list[int]]:
    """The greedy caption of each image (region sets: with their mask) as at test time (eval mode, float32), without
    moving the training RNGs."""
    was_training = model.training
    model.eval()
    try:
        with randomness.forked(images.device):
            decoded, _ = model.generate(images, beam_size=1, max_len=max_len, mask=mask)
    finally:
        model.train(was_training)
    return decoded.tokens


def self_critical_baseline(rewards: torch.Tensor, greedy_rewards: torch.Tensor, baseline: str,
                           samples_per_image: int) -> torch.Tensor:
    """b (B n,) for rewards (B n,) in rows b n + j: the greedy caption's reward (B,) repeated, or the mean reward of
    the image's other samples."""
    if baseline == "greedy":
        return greedy_rewards.repeat_interleave(samples_per_image)
    return leave_one_out_baseline(rewards, samples_per_image)


class SelfCritical:
    """objective=scst: maximise the expected CIDEr-D (or BLEU-4, or a mix) of sampled captions (see module doc)."""

    fine_tunes = True  # starts from a trained model (init_from)

    @constrained
    def __init__(self, baseline: Baseline = "mean", samples_per_image: Size = 5, max_len: Size = 16,
                 temperature: Annotated[float, Range(gt=0)] = 1.0, top_k: Annotated[int | None, Range(ge=1)] = None,
                 cider_weight: Weight = 1.0, bleu4_weight: Weight = 0.0, end_token: bool = True,
                 region_weight: Weight = 1.0, attention_weight: Weight = 0.0,
                 attention_reduction: AttentionReduction = "caption_mean", entropy_weight: Weight = 0.002,
                 baseline_decay: Decay = 0.9, doubly_stochastic: bool = True):
        if baseline == "mean" and samples_per_image < 2:
            raise ValueError("SelfCritical: baseline=mean (the other samples' mean reward) needs samples_per_image "
                             f">= 2, got {samples_per_image}; raise it or use baseline=greedy")
        if cider_weight + bleu4_weight == 0:
            raise ValueError("SelfCritical: cider_weight and bleu4_weight are both 0: the reward would be 0")
        self.baseline, self.samples_per_image, self.max_len = baseline, samples_per_image, max_len
        self.temperature, self.top_k, self.region_weight = temperature, top_k, region_weight
        self.weights, self.end_token = (cider_weight, bleu4_weight), end_token
        self.attention_weight, self.attention_reduction = attention_weight, attention_reduction
        self.entropy_weight, self.baseline_decay = entropy_weight, baseline_decay
        self.doubly_stochastic = doubly_stochastic
        self.reward: CaptionReward | None = None
        self.vocab: Vocabulary | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """The captioner as a sampling policy: its forward pass draws n captions per image."""
        return CaptionSampler(model, self.samples_per_image, self.max_len, self.temperature, self.top_k)

    def prepare(self, train: CaptionDataset) -> None:
        """The reward: the training references, tokenized, and CIDEr-D's document frequencies, computed once."""
        self.vocab = train.vocab
        self.reward = CaptionReward([r.raw for r in train.records], *self.weights, end_token=self.end_token,
                                    tokenizer=train.tokenizer)

    def texts(self, tokens: list[list[int]], ended: list[bool]) -> list[str]:
        """Word ids -> the strings the reward scores."""
        assert self.vocab is not None and self.reward is not None, "call prepare(train_split) first"
        return [self.reward.text(self.vocab.decode(t), e) for t, e in zip(tokens, ended)]

    def loss(self, ctx: LossContext, batch: Batch) -> tuple[LossTerms, dict[str, float]]:
        """Sample, score, and the REINFORCE surrogate of the caption (and, with hard attention, of its regions)."""
        assert self.reward is not None, "call prepare(train_split) first"
        n = self.samples_per_image
        with precision.autocast(ctx.device, ctx.amp_dtype):
            samples: Samples = ctx.forward(batch.images, batch.mask)
        greedy = greedy_captions(ctx.model, batch.images, self.max_len, batch.mask)
        images = list(batch.indices)  # the training image of each of the B images
        sampled = self.reward.scores([i for i in images for _ in range(n)],
                                     self.texts(samples.tokens.tolist(), samples.ended.tolist()))
        best = self.reward.scores(images, self.texts(greedy, [len(t) < self.max_len for t in greedy]))
        rewards = torch.as_tensor(self.reward(sampled), dtype=torch.float32, device=samples.log_probs.device)
        greedy_rewards = torch.as_tensor(self.reward(best), dtype=torch.float32, device=rewards.device)
        b = self_critical_baseline(rewards, greedy_rewards, self.baseline, n)  # (B n,)
        region_mask = None if batch.mask is None else batch.mask.repeat_interleave(n, dim=0)  # (B n, L)
        terms = self.terms(samples, rewards, b, ctx, region_mask)
        stats = {"reward": rewards.mean().item(), "reward_baseline": b.mean().item(),
                 "advantage": (rewards - b).mean().item(), "sample_CIDEr": float(sampled["CIDEr"].mean()),
                 "greedy_CIDEr": float(best["CIDEr"].mean()), "sample_length": samples.lengths.float().mean().item()}
        return terms, stats

    def terms(self, samples: Samples, rewards: torch.Tensor, b: torch.Tensor, ctx: LossContext,
              region_mask: torch.Tensor | None = None) -> LossTerms:
        """-mean (r - b) log q(y) (+ the doubly stochastic term over each sample's real regions `region_mask`;
        + the regions' REINFORCE and entropy terms)."""
        mask = samples.mask
        steps = mask.to(samples.log_probs.dtype)  # (N, T)
        total = reinforce_loss(samples.log_probs, rewards, b, mask)
        nll = -(samples.log_probs.detach() * steps).sum(dim=1)  # (N,) -log q(y) of each sample
        weight = self.attention_weight if self.doubly_stochastic or not ctx.samples_regions else 0.0
        reg = (doubly_stochastic(samples.alphas, mask, region_mask, self.attention_reduction) if weight
               else total.new_zeros(()))
        total = total + weight * reg
        policy = entropy = None
        if samples.region_log_probs is not None and samples.entropies is not None:  # hard attention sampled regions
            region_b = ctx.baseline.value if ctx.baseline.value is not None else rewards.mean().item()
            policy = reinforce_loss(samples.region_log_probs, rewards, region_b, mask)
            entropy = (samples.entropies * steps).sum(dim=1).mean()
            ctx.baseline.update(rewards)
            total = total + self.region_weight * policy - self.entropy_weight * entropy
        return LossTerms(total, nll.mean(), nll.sum() / steps.sum().clamp(min=1), reg, policy, entropy)

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond what the trainer saves: sampling draws from the global torch generator (checkpointed)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless (the regions' moving-average baseline is the trainer's)."""
