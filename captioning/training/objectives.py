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
  baseline (trainer.reinforce.baseline_decay), weighted by `region_weight`, plus the entropy term.

The trainer calls `loss(ctx, batch)` with a `LossContext`, and logs the dict returned beside the loss terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import torch
from torch import nn

from captioning.base.constraints import Range, constrained
from captioning.data.vocab import Vocabulary
from captioning.losses import (
    LossTerms,
    MovingAverageBaseline,
    doubly_stochastic,
    hard_attention_loss,
    leave_one_out_baseline,
    reinforce_loss,
)
from captioning.models.packing import prefix_lengths
from captioning.training import precision, randomness
from captioning.training.scst.rewards import CaptionReward
from captioning.training.scst.sampling import CaptionSampler, Samples

if TYPE_CHECKING:
    from captioning.data.dataset import Batch, CaptionDataset

Weight = Annotated[float, Range(ge=0)]
Count = Annotated[int, Range(ge=1)]
Baseline = Literal["greedy", "mean"]


@dataclass(frozen=True)
class LossSettings:
    """The trainer.* settings of the terms both objectives share (doubly stochastic term, hard attention)."""

    attention_weight: float
    attention_reduction: str
    reward_weight: float
    entropy_weight: float
    reward: str
    reduction: str
    num_samples: int
    doubly_stochastic: bool
    every_batch: bool

    @classmethod
    def of(cls, trainer: Any) -> LossSettings:
        """From the `trainer` config section."""
        rc = trainer.reinforce
        return cls(trainer.attention_weight, trainer.attention_reduction, rc.reward_weight, rc.entropy_weight,
                   rc.reward, rc.reduction, rc.num_samples, rc.doubly_stochastic, rc.every_batch)


@dataclass
class LossContext:
    """What an objective needs from the trainer for one minibatch."""

    forward: Any  # objective.wrap(model), or the DDP wrapper around it: gradients flow through it
    model: Any  # the plain Captioner (greedy decoding)
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype of the forward pass (None: fp32)
    baseline: MovingAverageBaseline  # hard attention's moving-average baseline of its sampled regions
    settings: LossSettings
    samples_regions: bool  # the attention samples regions (hard attention)


class CrossEntropy:
    """objective=xe: maximum likelihood of the reference captions (teacher forcing), as the paper trains."""

    fine_tunes = False  # trains from scratch

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the loss runs its forward pass through: the captioner itself."""
        return model

    def prepare(self, train: CaptionDataset) -> None:
        """Nothing to read from the training split."""

    def loss(self, ctx: LossContext, batch: Batch) -> tuple[LossTerms, dict[str, float]]:
        """Teacher-forced NLL (+ the doubly stochastic term, + REINFORCE terms when attention samples regions)."""
        s = ctx.settings
        captions, image_index = batch.captions, batch.image_index
        if s.num_samples > 1:  # N sampled attention paths per caption
            captions, image_index = captions.repeat(s.num_samples, 1), image_index.repeat(s.num_samples)
        lengths = prefix_lengths(captions[:, 1:], Vocabulary.pad_id)  # real words only (None: run every step)
        with precision.autocast(ctx.device, ctx.amp_dtype):
            out = ctx.forward(batch.images, captions, image_index, lengths)
        f32 = precision.to_float32  # the loss runs in float32 whatever dtype the forward pass ran in
        return hard_attention_loss(out.logits.float(), captions[:, 1:], out.alphas.float(), f32(out.log_probs),
                                   f32(out.entropies), Vocabulary.pad_id, ctx.baseline, s.attention_weight,
                                   s.reward_weight, s.entropy_weight, attention_reduction=s.attention_reduction,
                                   reward=s.reward, reduction=s.reduction, samples_regions=ctx.samples_regions,
                                   doubly_stochastic_term=s.doubly_stochastic, every_batch=s.every_batch), {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless."""


@torch.no_grad()
def greedy_captions(model: Any, images: torch.Tensor, max_len: int) -> list[list[int]]:
    """The greedy caption of each image as at test time (eval mode, float32), without moving the training RNGs."""
    was_training = model.training
    model.eval()
    try:
        with randomness.forked(images.device):
            decoded, _ = model.generate(images, beam_size=1, max_len=max_len)
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
    def __init__(self, baseline: Baseline = "mean", samples_per_image: Count = 5, max_len: Count = 16,
                 temperature: Annotated[float, Range(gt=0)] = 1.0, top_k: Annotated[int | None, Range(ge=1)] = None,
                 cider_weight: Weight = 1.0, bleu4_weight: Weight = 0.0, end_token: bool = True,
                 region_weight: Weight = 1.0):
        if baseline == "mean" and samples_per_image < 2:
            raise ValueError("SelfCritical: baseline=mean (the other samples' mean reward) needs samples_per_image "
                             f">= 2, got {samples_per_image}; raise it or use baseline=greedy")
        if cider_weight + bleu4_weight == 0:
            raise ValueError("SelfCritical: cider_weight and bleu4_weight are both 0: the reward would be 0")
        self.baseline, self.samples_per_image, self.max_len = baseline, samples_per_image, max_len
        self.temperature, self.top_k, self.region_weight = temperature, top_k, region_weight
        self.weights, self.end_token = (cider_weight, bleu4_weight), end_token
        self.reward: CaptionReward | None = None
        self.vocab: Vocabulary | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """The captioner as a sampling policy: its forward pass draws n captions per image."""
        return CaptionSampler(model, self.samples_per_image, self.max_len, self.temperature, self.top_k)

    def prepare(self, train: CaptionDataset) -> None:
        """The reward: the training references, tokenized, and CIDEr-D's document frequencies, computed once."""
        self.vocab = train.vocab
        self.reward = CaptionReward([r.raw for r in train.records], *self.weights, end_token=self.end_token)

    def texts(self, tokens: list[list[int]], ended: list[bool]) -> list[str]:
        """Word ids -> the strings the reward scores."""
        assert self.vocab is not None and self.reward is not None, "call prepare(train_split) first"
        return [self.reward.text(self.vocab.decode(t), e) for t, e in zip(tokens, ended)]

    def loss(self, ctx: LossContext, batch: Batch) -> tuple[LossTerms, dict[str, float]]:
        """Sample, score, and the REINFORCE surrogate of the caption (and, with hard attention, of its regions)."""
        assert self.reward is not None, "call prepare(train_split) first"
        n = self.samples_per_image
        with precision.autocast(ctx.device, ctx.amp_dtype):
            samples: Samples = ctx.forward(batch.images)
        greedy = greedy_captions(ctx.model, batch.images, self.max_len)
        images = list(batch.indices)  # the training image of each of the B images
        sampled = self.reward.scores([i for i in images for _ in range(n)],
                                     self.texts(samples.tokens.tolist(), samples.ended.tolist()))
        best = self.reward.scores(images, self.texts(greedy, [len(t) < self.max_len for t in greedy]))
        rewards = torch.as_tensor(self.reward(sampled), dtype=torch.float32, device=samples.log_probs.device)
        greedy_rewards = torch.as_tensor(self.reward(best), dtype=torch.float32, device=rewards.device)
        b = self_critical_baseline(rewards, greedy_rewards, self.baseline, n)  # (B n,)
        terms = self.terms(samples, rewards, b, ctx)
        stats = {"reward": rewards.mean().item(), "reward_baseline": b.mean().item(),
                 "advantage": (rewards - b).mean().item(), "sample_CIDEr": float(sampled["CIDEr"].mean()),
                 "greedy_CIDEr": float(best["CIDEr"].mean()), "sample_length": samples.lengths.float().mean().item()}
        return terms, stats

    def terms(self, samples: Samples, rewards: torch.Tensor, b: torch.Tensor, ctx: LossContext) -> LossTerms:
        """-mean (r - b) log q(y) (+ the doubly stochastic term; + the regions' REINFORCE and entropy terms)."""
        s, mask = ctx.settings, samples.mask
        steps = mask.to(samples.log_probs.dtype)  # (N, T)
        total = reinforce_loss(samples.log_probs, rewards, b, mask)
        nll = -(samples.log_probs.detach() * steps).sum(dim=1)  # (N,) -log q(y) of each sample
        weight = s.attention_weight if s.doubly_stochastic or not ctx.samples_regions else 0.0
        reg = doubly_stochastic(samples.alphas, mask, None, s.attention_reduction) if weight else total.new_zeros(())
        total = total + weight * reg
        policy = entropy = None
        if samples.region_log_probs is not None and samples.entropies is not None:  # hard attention sampled regions
            region_b = ctx.baseline.value if ctx.baseline.value is not None else rewards.mean().item()
            policy = reinforce_loss(samples.region_log_probs, rewards, region_b, mask)
            entropy = (samples.entropies * steps).sum(dim=1).mean()
            ctx.baseline.update(rewards)
            total = total + self.region_weight * policy - s.entropy_weight * entropy
        return LossTerms(total, nll.mean(), nll.sum() / steps.sum().clamp(min=1), reg, policy, entropy)

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond what the trainer saves: sampling draws from the global torch generator (checkpointed)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless (the regions' moving-average baseline is the trainer's)."""
