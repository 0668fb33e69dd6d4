"""What every decoder of the family shares: its output, the state initialisation from the mean annotation, and the
interface decoding, training, export and visualisation use.

A decoder turns annotation vectors a (B, L, D) into words. Its interface (`Decoder`):

    attention.prepare(a, grid, mask) -> keys  per-image work, once per image
    init_state(a, mask) -> state              a tuple of tensors, the row first (beam search reorders rows)
    step(words, state, a, keys, mask)         one decoding step: logits (N, V), the new state, its AttentionOutput
    forward(a, captions, image_index, mask, grid, lengths) -> DecoderOutput      teacher forcing
    forward_plain(...)                                                           the same, written plainly

The LSTM decoders (`recurrent.RecurrentDecoder`) write their recurrence once; `unroll.py` runs it step by step for
`step` and `forward_plain`, or over the real tokens only for `forward`. The Transformer has its own parallel
`forward` and shares the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

InitActivation = Literal["tanh", "relu"]  # the init MLP's hidden layers


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions of T steps (given their lengths: zero after a caption's end)."""

    logits: torch.Tensor  # (N, T, V); given lengths (R, V), the R real tokens caption by caption
    alphas: torch.Tensor  # (N, T, L)
    betas: torch.Tensor  # (N, T)
    log_probs: torch.Tensor | None = None  # (N, T) log p(s_t | a) of sampled regions (hard attention)
    entropies: torch.Tensor | None = None  # (N, T) H(alpha_t) (hard attention)


class Decoder(nn.Module):
    """The interface every decoder of the family has (see the module): decoding, training, export and the figures
    need nothing else. `rows_share_images`: `step` takes a, keys and mask once per image with k state rows each."""

    rows_share_images = True
    extra_weights = "channels"  # what AttentionOutput.channels holds per word ("sentinel": decoder=adaptive's beta_t)
    attention: Any  # .prepare(a, grid, mask) -> keys; .begin_batch() before each training minibatch

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """What the last training batch showed of the model that the training log keeps per step (M2: the share of
        attention on its memory slots); most decoders have nothing."""
        return {}

    def step(self, words: torch.Tensor, state: Any, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Any, Any]:
        """One decoding step from the previous words (N,): logits (N, V), the new state, its AttentionOutput."""
        raise NotImplementedError

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """Teacher forcing as decoding runs it, step by step: the oracle `forward` is compared with."""
        raise NotImplementedError


def mlp(in_dim: int, out_dim: int, layers: int, *, activation: InitActivation = "tanh",
        dropout: float = 0.0) -> nn.Module:
    """An MLP of `layers` linear layers (in_dim -> in_dim -> ... -> out_dim): each hidden layer followed by
    `activation`, then dropout when `dropout` > 0. The authors' COCO state init: 2 layers, ReLU, dropout 0.5
    (`capgen.py:L626-631`)."""
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        act: nn.Module = nn.Tanh() if activation == "tanh" else nn.ReLU()
        if dropout > 0:  # in the activation's slot: the linears' state-dict keys do not depend on the rate
            act = nn.Sequential(act, nn.Dropout(dropout))
        mods += [nn.Linear(in_dim, in_dim), act]
    return nn.Sequential(*mods, nn.Linear(in_dim, out_dim))


def mean_annotation(a: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """mean_i a_i over the valid regions (N, D) of a (N, L, D), and alpha uniform over them (N, L)."""
    if mask is None:
        return a.mean(dim=1), a.new_full(a.shape[:2], 1.0 / a.shape[1])  # (N, D), (N, L)
    m = mask.unsqueeze(-1).to(a.dtype)  # (N, L, 1)
    mean = (a * m).sum(1) / m.sum(1).clamp(min=1)  # (N, D)
    return mean, mask.to(a.dtype) / mask.sum(1, keepdim=True).clamp(min=1)  # (N, D), (N, L)


def annotation_state(a: torch.Tensor, mask: torch.Tensor | None, init_h: nn.Module | None,
                     init_c: nn.Module | None, hidden_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h_0, c_0 = tanh(f_init(mean_i a_i)) (zeros without f_init); the previous alpha is uniform over valid regions."""
    mean, alpha0 = mean_annotation(a, mask)  # (N, D), (N, L)
    if init_h is None or init_c is None:
        zeros = a.new_zeros(a.shape[0], hidden_dim)  # (N, n)
        return zeros, zeros.clone(), alpha0
    return torch.tanh(init_h(mean)), torch.tanh(init_c(mean)), alpha0
