"""Attention over annotation vectors: the decoder state h_{t-1} picks a context z_t from a_1..a_L.

Every attention module has the same interface so that Hydra can swap them:
    keys = attn.prepare(a, grid, mask)          # once per image; grid = (h, w) with L = h * w
    out = attn(a, keys, h, mask, prev_alpha)    # once per step -> out.context (N, D), out.alpha (N, L)

h (N, n) may hold k consecutive rows per image of a (B, L, D), keys and mask (N = B k, row r is image r // k):
beam search attends from the k beams of an image, and training from the k captions of an image, without copying
a, keys or mask k times. With k = 1 (one row per image) this is the plain per-row attention.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from captioning.base.constraints import Probability, Size, constrained
from captioning.models.fused.additive import additive_scores as fused_additive_scores
from captioning.models.rows import rows_per_image

TestMode = Literal["expectation", "argmax", "sample"]  # hard attention at test time


@dataclass
class AttentionOutput:
    """One attention step: the context z_t and the weights alpha_t (plus sampling terms for hard attention)."""

    context: torch.Tensor  # (N, D)
    alpha: torch.Tensor  # (N, L), sums to 1 over unmasked regions
    log_prob: torch.Tensor | None = None  # (N,) log p(s_t | a) of a sampled region
    entropy: torch.Tensor | None = None  # (N,) H(alpha_t)
    index: torch.Tensor | None = None  # (N,) the sampled / chosen region
    heads: torch.Tensor | None = None  # (N, H, L) each head's weights (multi-head attention; alpha is their mean)
    carry: torch.Tensor | None = None  # (N, L) what the next step gets as prev_alpha, when it is not alpha
    channels: torch.Tensor | None = None  # (N, C) channel weights (channel-wise attention), or multirep's K

    def select(self, rows: torch.Tensor) -> AttentionOutput:
        """The outputs of these rows (n,) only."""
        pick = [None if x is None else x.index_select(0, rows)
                for x in (self.context, self.alpha, self.log_prob, self.entropy, self.index, self.heads, self.carry,
                          self.channels)]
        return AttentionOutput(*pick)  # type: ignore[arg-type]

    @property
    def maps(self) -> torch.Tensor:
        """What decoding keeps of each word: alpha (N, L), followed by the channel weights (N, L + C) when there are
        any (`captioning.models.decoded.split_maps` parts them again)."""
        return self.alpha if self.channels is None else torch.cat([self.alpha, self.channels.to(self.alpha.dtype)], 1)

    @property
    def recurrent(self) -> torch.Tensor:
        """The (N, L) the decoder's state keeps for the next step's prev_alpha: `carry`, or alpha without one."""
        return self.alpha if self.carry is None else self.carry


def attention_name(module: object) -> str:
    """The conf/attention/ name of an attention module's class, for messages (SoftAttention -> soft)."""
    return type(module).__name__.removesuffix("Attention").lower()


def core_of(module: object) -> object:
    """A decoder's attention module's own type (`Attention.core`), or the module itself when it is not one of the
    attention group's (the Transformer's AnnotationMemory)."""
    return module.core if isinstance(module, Attention) else module


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over regions (last dim) that gives padded regions (mask False) exactly zero weight."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def row_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """alpha (N, L) from scores (N, L) and a mask per row (N, L) or per image (B, L), k = N / B rows each."""
    if mask is None or mask.shape[0] == scores.shape[0]:
        return masked_softmax(scores, mask)
    B, L = mask.shape
    return masked_softmax(scores.view(B, -1, L), mask.unsqueeze(1)).view(-1, L)  # (B, k, L) -> (N, L)


def attend(a: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None) -> AttentionOutput:
    """alpha = masked softmax of the scores (N, L); context z = sum_i alpha_i a_i (N, D) for a (B, L, D)."""
    return weighted(a, row_softmax(scores, mask))


def weighted(a: torch.Tensor, alpha: torch.Tensor) -> AttentionOutput:
    """The context z = sum_i alpha_i a_i (N, D) of weights alpha (N, L) over a (B, L, D), k = N / B rows each."""
    B, L, D = a.shape
    context = torch.bmm(alpha.view(B, -1, L), a)  # (B, k, L) @ (B, L, D) -> (B, k, D)
    return AttentionOutput(context.view(-1, D), alpha)  # (N, D)


def additive_scores(keys: torch.Tensor, q: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
                    *, plain: bool = False) -> torch.Tensor:
    """e_ti = w^T tanh(keys_i + q_t) + b (the paper's f_att): (N, L) for keys (B, L, A) and queries q (N, A),
    k = N / B queries per image. `plain`: the formula below on every device (else the fused kernel on a CPU)."""
    if not plain and keys.device.type == "cpu":  # the hand-fused score: 2-3x faster, stores no hidden layer
        return fused_additive_scores(keys, q, w, b)
    B, L, A = keys.shape
    hidden = torch.tanh(keys.unsqueeze(1) + q.view(B, -1, 1, A))  # (B, 1, L, A) + (B, k, 1, A) -> (B, k, L, A)
    e = torch.matmul(hidden, w.to(hidden.dtype))  # (B, k, L)
    return (e if b is None else e + b.to(e.dtype)).view(-1, L)  # (N, L)


class Attention(nn.Module):
    """Base class: subclasses implement `prepare` (per image) and `forward` (per step).

    `reads_previous`: the weights depend on the previous step's (prev_alpha), so a decoder must run the steps in
    order (decoder=transformer refuses such a type). `initial_carry` is the prev_alpha of the first step.
    `sums_to_one`: alpha sums to 1 over the real regions (False: to at most 1, monotonic attention).
    """

    reads_previous = False
    sums_to_one = True

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__()
        self.annotation_dim, self.hidden_dim = annotation_dim, hidden_dim
        self.plain_kernels = False  # True: no fused CPU kernel, the plain formula (`fused.plain_kernels(model)`)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per-image work that does not depend on the step (e.g. W_a a_i): one tensor whose first dim is the image.

        `grid` is the (h, w) layout of the L = h * w regions (row-major); images with smaller grids are
        padded to it and their padded regions masked out: `mask` (B, L), True at real regions (None: all real),
        the same mask every step gets.
        """
        return a

    def begin_batch(self) -> None:
        """Called by the trainer before each training minibatch (hard attention tosses its coin here)."""

    @property
    def core(self) -> Attention:
        """The attention type's own module: this one, or the one a wrapper runs (decoder=aoa, adaptive: the
        attention over their transformed annotations); what `isinstance` checks of the type should read."""
        return self

    def reads_previous_because(self) -> str:
        """The options that make this type read the previous step's weights ('' for the type itself), for messages."""
        return ""

    def initial_carry(self, uniform: torch.Tensor) -> torch.Tensor:
        """The prev_alpha of the first step (N, L), given alpha uniform over each row's real regions (N, L): that
        uniform alpha, unless the type starts elsewhere (monotonic attention: on the first region)."""
        return uniform

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        raise NotImplementedError


def _key_layers(attention_dim: int, layers: int) -> nn.Sequential:
    """`layers` further layers k <- tanh(W_l k + b_l) (A x A each) on the projected annotations."""
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(attention_dim, attention_dim), nn.Tanh()]
    return nn.Sequential(*mods)


class SoftAttention(Attention):
    """The paper's deterministic attention: e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b), z_t = sum_i alpha_ti a_i.

    `attention_layers` > 1 is arctic-captions' deeper attention MLP (`n_layers_att`, 2 in its COCO script,
    `evaluate_coco.py:L60`): each further layer maps the keys k_i = W_a a_i + b through tanh(W_l k_i + b_l)
    (`capgen.py:L356-362`), once per image in `prepare`, so the per-step score is unchanged.
    """

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128, attention_layers: Size = 1):
        super().__init__(annotation_dim, hidden_dim)
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.w = nn.Linear(attention_dim, 1)  # its bias adds one constant to every score: it cancels in the softmax
        # and gets no gradient, kept as arctic-captions keeps it (decoder_c_tt) so that seeded runs draw as before
        # Created last, and only when asked for: W_a, W_h and w draw the same initial values either way.
        self.key_mlp = _key_layers(attention_dim, attention_layers - 1) if attention_layers > 1 else None

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        keys = self.W_a(a)  # (B, L, A): computed once per image, not once per step
        return keys if self.key_mlp is None else self.key_mlp(keys)  # (B, L, A)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (N, L) from keys (B, L, A) and h (N, n)."""
        return additive_scores(keys, self.W_h(h), self.w.weight.view(-1), self.w.bias,
                               plain=self.plain_kernels)  # (N, L)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        return attend(a, self.scores(keys, h), mask)


class HardAttention(SoftAttention):
    """The paper's stochastic attention: s_t ~ Multinomial(alpha_t), z_t = a_{s_t}; trained with REINFORCE.

    In training, each minibatch (see `begin_batch`) uses the expected context (the soft step) with probability
    `expected_context_prob`, else samples one region per step and reports log p(s_t | a) and H(alpha_t) for
    the REINFORCE terms in `captioning.training.losses`. At test time `test_mode` picks the context: the expectation
    (deterministic, the default), the argmax region, or a sampled region.
    """

    TEST_MODES: tuple[str, ...] = typing.get_args(TestMode)

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128, attention_layers: Size = 1,
                 expected_context_prob: Probability = 0.75, test_mode: TestMode = "expectation"):
        super().__init__(annotation_dim, hidden_dim, attention_dim, attention_layers)
        self.expected_context_prob, self.test_mode = expected_context_prob, test_mode
        self.sample_this_batch = True

    def begin_batch(self) -> None:
        """Toss the per-minibatch coin: sample regions, or use the expected context for this batch."""
        self.sample_this_batch = bool(torch.rand(()) >= self.expected_context_prob)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        mode = ("sample" if self.sample_this_batch else "expectation") if self.training else self.test_mode
        if mode == "expectation":
            return attend(a, self.scores(keys, h), mask)  # (N, D)
        alpha = row_softmax(self.scores(keys, h), mask)  # (N, L)
        if mode == "argmax":
            index = alpha.argmax(dim=1)  # (N,)
        else:
            index = torch.multinomial(alpha.detach(), 1).squeeze(1)  # (N,): the same draws as one row per image
        rows = torch.arange(alpha.shape[0], device=a.device)  # (N,)
        context = a[rows // rows_per_image(a.shape[0], alpha.shape[0]), index]  # (N, D): one region's annotation
        log_prob = torch.log(alpha.gather(1, index.unsqueeze(1)).squeeze(1))  # (N,)
        entropy = -torch.special.xlogy(alpha, alpha).sum(dim=1)  # (N,), masked regions add 0
        return AttentionOutput(context, alpha, log_prob, entropy, index)
