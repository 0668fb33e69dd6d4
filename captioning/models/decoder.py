"""The paper's LSTM decoder: MLP state init, attention with a scalar gate, LSTM, deep output layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from captioning.models.attention import Attention, AttentionOutput

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # h (N, n), c (N, n), previous alpha (N, L)


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions of T steps."""

    logits: torch.Tensor  # (N, T, V)
    alphas: torch.Tensor  # (N, T, L)
    betas: torch.Tensor  # (N, T)
    log_probs: torch.Tensor | None = None  # (N, T) log p(s_t | a) of sampled regions (hard attention)
    entropies: torch.Tensor | None = None  # (N, T) H(alpha_t) (hard attention)


def _mlp(in_dim: int, out_dim: int, layers: int) -> nn.Module:
    """A tanh MLP with `layers` linear layers (the authors' COCO model uses 2 for the state init)."""
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(in_dim, in_dim), nn.Tanh()]
    return nn.Sequential(*mods, nn.Linear(in_dim, out_dim))


class ShowAttendTellDecoder(nn.Module):
    """LSTM decoder of Xu et al. (2015) with pluggable attention."""

    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: int = 512, hidden_dim: int = 512, init_layers: int = 1,
                 selector: bool = True, dropout: float = 0.5, init_from_annotations: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        # The paper initialises h_0, c_0 from the mean annotation; zeros is an ablation that makes every bit of
        # image information reach the decoder through attention.
        self.init_h = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.selector = nn.Linear(hidden_dim, 1) if selector else None  # beta_t, a scalar gate
        self.lstm = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.L_h = nn.Linear(hidden_dim, embed_dim)
        self.L_z = nn.Linear(annotation_dim, embed_dim)
        self.L_o = nn.Linear(embed_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> State:
        """h_0, c_0 = tanh(f_init(mean_i a_i)) (or zeros); the previous alpha starts uniform over valid regions."""
        if mask is None:
            mean = a.mean(dim=1)  # (N, D)
            alpha0 = a.new_full(a.shape[:2], 1.0 / a.shape[1])  # (N, L)
        else:
            m = mask.unsqueeze(-1).to(a.dtype)  # (N, L, 1)
            mean = (a * m).sum(1) / m.sum(1).clamp(min=1)  # (N, D)
            alpha0 = mask.to(a.dtype) / mask.sum(1, keepdim=True).clamp(min=1)  # (N, L)
        if self.init_h is None:
            zeros = a.new_zeros(a.shape[0], self.hidden_dim)  # (N, n)
            return zeros, zeros.clone(), alpha0
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean)), alpha0

    def output(self, emb: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output: logits = L_o(dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))."""
        return self.L_o(self.dropout(torch.tanh(emb + self.L_h(h) + self.L_z(z))))

    def attend(self, a: torch.Tensor, keys: torch.Tensor, state: State,
               mask: torch.Tensor | None) -> tuple[AttentionOutput, torch.Tensor, torch.Tensor]:
        """Attention from h_{t-1}: returns the output, the gated context beta_t z_t (N, D) and beta_t (N,)."""
        h, _, prev_alpha = state
        att = self.attention(a, keys, h, mask, prev_alpha)
        if self.selector is None:
            return att, att.context, h.new_ones(h.shape[0])
        beta = torch.sigmoid(self.selector(h))  # (N, 1)
        return att, beta * att.context, beta.squeeze(1)

    def step(self, words: torch.Tensor, state: State, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, State, AttentionOutput]:
        """One decoding step from the previous words (N,): returns logits (N, V), the new state, attention."""
        emb = self.embed(words)  # (N, m)
        att, z, _ = self.attend(a, keys, state, mask)
        h, c = self.lstm(torch.cat([emb, z], dim=1), state[:2])  # (N, n)
        return self.output(emb, h, z), (h, c, att.alpha), att

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image."""
        keys = self.attention.prepare(a, grid)  # (B, L, A): once per image, before expanding to captions
        if image_index is not None:
            a, keys = a[image_index], keys[image_index]  # (N, L, D), (N, L, A)
            mask = None if mask is None else mask[image_index]
        state = self.init_state(a, mask)
        emb = self.embed(captions[:, :-1])  # (N, T, m)
        hs, zs, alphas, betas, log_probs, entropies = [], [], [], [], [], []
        for t in range(captions.shape[1] - 1):
            att, z, beta = self.attend(a, keys, state, mask)
            h, c = self.lstm(torch.cat([emb[:, t], z], dim=1), state[:2])
            state = (h, c, att.alpha)
            hs.append(h), zs.append(z), alphas.append(att.alpha), betas.append(beta)
            if att.log_prob is not None:
                log_probs.append(att.log_prob), entropies.append(att.entropy)
        logits = self.output(emb, torch.stack(hs, 1), torch.stack(zs, 1))  # (N, T, V) in one matmul
        return DecoderOutput(
            logits=logits,
            alphas=torch.stack(alphas, 1),  # (N, T, L)
            betas=torch.stack(betas, 1),  # (N, T)
            log_probs=torch.stack(log_probs, 1) if log_probs else None,
            entropies=torch.stack(entropies, 1) if entropies else None,
        )
