"""Monotonic attention (Raffel et al. 2017, "Online and Linear-Time Attention by Enforcing Monotonic Alignments").

At each output step the alignment scans the memory from where it stopped last time and, at each entry j, stops there
with probability p_choose_j (a sigmoid of an energy) or moves on. `monotonic_attention` is the distribution of where it
stops, given where it stopped last step, with TensorFlow's contract (`tfa.seq2seq.monotonic_attention`):

    recursive   alpha_j = p_j q_j,   q_j = (1 - p_{j-1}) q_{j-1} + previous_j   (q_0 = previous_0): exact, L steps
    parallel    alpha = p * cumprod_excl(1 - p) * cumsum(previous / clip(cumprod_excl(1 - p), 1e-10, 1)), with the
                cumulative product as exp(cumsum(log(clip(1 - p, tiny, 1)))): the closed form, equal to recursive
                unless a cumulative product underflows (p near 1 early in the memory) and the clipping bites
    hard        p in {0, 1}: stop at the first j at or after the previous stop with p_j = 1 (cumsum(previous) keeps
                what is not before it); for binary p it is recursive's result, computed in one pass

alpha may sum to less than 1: the mass of scans that ran off the end without stopping (attending to nothing).
Rows of `previous` that sum to 0 stay 0.

`MonotonicAttention` (attention=monotonic) is the attention module around it for the decoders of this toolkit.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from captioning.base.constraints import Size, Weight, constrained
from captioning.models.attention import Attention, AttentionOutput, weighted
from captioning.models.attention_family import ConcatAttention, GeneralAttention, resolve_grid
from captioning.models.grid_attention import ReadingOrder, reading_order
from captioning.models.rows import rows_per_image

MonotonicMode = Literal["parallel", "recursive", "hard"]
MODES: tuple[str, ...] = typing.get_args(MonotonicMode)


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """sum_{i < j} x_i along dim 1 (B, L)."""
    return F.pad(torch.cumsum(x, dim=1)[:, :-1], (1, 0))


def safe_cumprod(x: torch.Tensor) -> torch.Tensor:
    """The exclusive cumulative product prod_{i < j} x_i along dim 1 as exp(cumsum(log(clip(x, tiny, 1)))):
    TensorFlow's `safe_cumprod`, with a gradient where a zero factor would give none."""
    tiny = torch.finfo(x.dtype).tiny
    return torch.exp(exclusive_cumsum(torch.log(x.clamp(tiny, 1.0))))


def monotonic_attention(p_choose: torch.Tensor, previous: torch.Tensor, mode: MonotonicMode) -> torch.Tensor:
    """The monotonic alignment (B, L) from stopping probabilities p_choose (B, L) and the previous step's
    alignment previous (B, L), computed `mode`'s way (see the module): TensorFlow's `monotonic_attention`."""
    if p_choose.dim() != 2 or previous.shape != p_choose.shape:
        raise ValueError(f"p_choose and previous must both be (B, L), got {tuple(p_choose.shape)} and "
                         f"{tuple(previous.shape)}")
    if mode == "recursive":
        q = previous.new_zeros(previous.shape[0])  # (B,)
        stops = []
        for j in range(p_choose.shape[1]):
            q = previous[:, j] if j == 0 else (1 - p_choose[:, j - 1]) * q + previous[:, j]
            stops.append(p_choose[:, j] * q)
        return torch.stack(stops, dim=1)
    if mode == "parallel":
        kept = safe_cumprod(1 - p_choose)  # (B, L) prod_{i < j} (1 - p_i)
        return p_choose * kept * torch.cumsum(previous / kept.clamp(1e-10, 1.0), dim=1)
    if mode == "hard":
        chosen = p_choose * torch.cumsum(previous, dim=1)  # no stop before the previous one
        return chosen * (exclusive_cumsum(chosen) == 0).to(chosen.dtype)  # the first stop only
    raise ValueError(f"monotonic attention mode must be one of {', '.join(MODES)}, got {mode!r}")


class MonotonicAttention(Attention):
    """Monotonic attention over the grid read in a fixed order (`attention=monotonic`), Raffel et al. (2017).

    The energy of region i is `energy`'s score plus a learnable scalar r, initialised at `score_bias_init`:
    bahdanau, v^T tanh(W_x a_i + W_h h) (TensorFlow's BahdanauMonotonicAttention: attention=concat's score), or
    luong, h^T W_a a_i / sqrt(n) (its LuongMonotonicAttention, attention=general's scaled score). In training,
    `sigmoid_noise` times standard normal noise is added to the energy before the sigmoid (Raffel et al.: it pushes
    the stopping probabilities towards 0 or 1, so that the hard decoding matches training); the noise comes from the
    global generator, or, with `sigmoid_noise_seed`, from a generator seeded by it and a count of the calls so far
    (a buffer: a checkpoint resumes it exactly). p_choose = sigmoid(energy) on real regions, 0 on padded ones (the
    scan passes them).

    The scan reads the regions in `order` (row, column or snake over the (h, w) grid, all from the top-left);
    the first step's previous alignment is a one-hot on the first real region of that order. Training computes the
    alignment with `mode` (parallel or recursive; hard has no gradient for the energy, so it is refused there), and
    evaluation and decoding with `test_mode` (hard by default, as Raffel et al. decode: p = 1 where the energy is
    positive).

    alpha sums to 1 minus the probability that the scan ran off the end (attending to nothing); the context is
    sum_i alpha_i a_i, so it shrinks with it. The doubly stochastic term needs no change (it pushes every region's
    total weight over the caption towards 1, the deficit included); figures draw a map with no weight as a fully
    faded image, and attention correctness is each word's share of the weight it gave inside the box, 0 for a word
    that gave none (captioning.metrics.attention).
    """

    reads_previous = True
    sums_to_one = False

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, energy: Literal["bahdanau", "luong"] = "bahdanau",
                 attention_dim: Size = 128, score_bias_init: float = -1.0, sigmoid_noise: Weight = 1.0,
                 sigmoid_noise_seed: int | None = None, mode: MonotonicMode = "parallel",
                 test_mode: MonotonicMode = "hard", order: ReadingOrder = "row"):
        super().__init__(annotation_dim, hidden_dim)
        if mode == "hard":
            raise ValueError("attention=monotonic cannot train with mode=hard: its 0/1 stopping probabilities give "
                             "the energy no gradient; train with mode=parallel or recursive and decode with "
                             "test_mode=hard (Raffel et al. 2017)")
        self.scorer: ConcatAttention | GeneralAttention = (
            ConcatAttention(annotation_dim, hidden_dim, attention_dim) if energy == "bahdanau"
            else GeneralAttention(annotation_dim, hidden_dim))
        self.score_bias = nn.Parameter(torch.tensor(float(score_bias_init)))
        self.sigmoid_noise, self.sigmoid_noise_seed = sigmoid_noise, sigmoid_noise_seed
        self.mode, self.test_mode, self.order = mode, test_mode, order
        self.noise_draws: torch.Tensor
        self.register_buffer("noise_draws", torch.zeros((), dtype=torch.long))  # calls that drew seeded noise

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """The scorer's keys once per image, laid out on the grid (B, h, w, K): the layout travels in the shape."""
        B, L, _ = a.shape
        h, w = resolve_grid(L, grid)
        return self.scorer.prepare(a, grid, mask).view(B, h, w, -1)

    def _order(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The row-major region indices in reading order (L,) for keys (B, h, w, K), and each region's place in it."""
        order = reading_order(keys.shape[1], keys.shape[2], self.order)
        return order.to(keys.device), torch.argsort(order).to(keys.device)

    def initial_carry(self, uniform: torch.Tensor) -> torch.Tensor:
        """A one-hot on the first real region in reading order, which is the first real one in row-major order
        (every order starts at the top-left and padding is at the bottom and right of a grid)."""
        real = (uniform > 0).to(torch.int64)  # (N, L)
        first = real.cumsum(1) == 1  # (N, L): real regions up to and including the first, then not after it
        return (first & real.bool()).to(uniform.dtype)

    def noise(self, like: torch.Tensor) -> torch.Tensor:
        """sigmoid_noise * N(0, 1) shaped like the energies (see the class)."""
        if self.sigmoid_noise_seed is None:
            return self.sigmoid_noise * torch.randn_like(like)
        generator = torch.Generator(device=like.device)
        generator.manual_seed(self.sigmoid_noise_seed * 1_000_003 + int(self.noise_draws))
        self.noise_draws.add_(1)
        return self.sigmoid_noise * torch.randn(like.shape, generator=generator, device=like.device,
                                                dtype=like.dtype)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        if keys.dim() != 4:
            raise ValueError(f"MonotonicAttention expects keys (B, h, w, K) from its prepare(), got "
                             f"{tuple(keys.shape)}")
        B, gh, gw, K = keys.shape
        L, N = gh * gw, h.shape[0]
        k = rows_per_image(B, N)
        energy = self.scorer.scores(keys.view(B, L, K), h) + self.score_bias  # (N, L)
        mode = self.mode if self.training else self.test_mode
        if self.training and self.sigmoid_noise > 0:
            energy = energy + self.noise(energy)
        p_choose = (energy > 0).to(energy.dtype) if mode == "hard" else torch.sigmoid(energy)  # (N, L)
        if mask is not None:
            p_choose = p_choose * mask.repeat_interleave(k, dim=0).to(p_choose.dtype)  # the scan passes padding
        if prev_alpha is None:
            real = a.new_ones(N, L) if mask is None else mask.repeat_interleave(k, dim=0).to(a.dtype)
            prev_alpha = self.initial_carry(real)
        order, place = self._order(keys)  # (L,) each
        aligned = monotonic_attention(p_choose[:, order], prev_alpha[:, order].to(p_choose.dtype), mode)  # (N, L)
        return weighted(a, aligned[:, place].to(a.dtype))  # back to row-major
