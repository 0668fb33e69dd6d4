"""The paper's LSTM decoder: MLP state init, attention with a scalar gate, LSTM, deep output layer.

`step` is one decoding step and `forward_plain` the paper's teacher forcing, both written plainly (decoding calls
`step`); `forward` computes what `forward_plain` does for all T steps, faster: what does not depend on the step is
computed once (W_a a_i, the word part of the LSTM input projection, the deep output), the k captions of an image
share its a and keys (no copies), the recurrent projection's weight gradient is one GEMM over all steps
(`fused.UnrolledLSTM`), and given the captions' lengths each step runs only the captions still running
(`captioning.models.packing`). tests/models/test_fast_path.py checks that both give the same logits, losses and
gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.fused import UnrolledLSTM, autocast_input
from captioning.models.packing import StepPlan
from captioning.models.rows import images_and_rows, plain_rows, repeat_rows

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # h (N, n), c (N, n), previous alpha (N, L)


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions of T steps (given their lengths: zero after a caption's end)."""

    logits: torch.Tensor  # (N, T, V); given lengths (R, V), the R real tokens caption by caption
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


def annotation_state(a: torch.Tensor, mask: torch.Tensor | None, init_h: nn.Module | None,
                     init_c: nn.Module | None, hidden_dim: int) -> State:
    """h_0, c_0 = tanh(f_init(mean_i a_i)) (zeros without f_init); the previous alpha is uniform over valid regions."""
    if mask is None:
        mean = a.mean(dim=1)  # (N, D)
        alpha0 = a.new_full(a.shape[:2], 1.0 / a.shape[1])  # (N, L)
    else:
        m = mask.unsqueeze(-1).to(a.dtype)  # (N, L, 1)
        mean = (a * m).sum(1) / m.sum(1).clamp(min=1)  # (N, D)
        alpha0 = mask.to(a.dtype) / mask.sum(1, keepdim=True).clamp(min=1)  # (N, L)
    if init_h is None or init_c is None:
        zeros = a.new_zeros(a.shape[0], hidden_dim)  # (N, n)
        return zeros, zeros.clone(), alpha0
    return torch.tanh(init_h(mean)), torch.tanh(init_c(mean)), alpha0


def plain_output(logits: torch.Tensor, atts: list[AttentionOutput], betas: list[torch.Tensor]) -> DecoderOutput:
    """A step-by-step loop's outputs stacked over steps: logits (N, T, V), alphas (N, T, L), betas (N, T)."""
    sampled = bool(atts) and atts[0].log_prob is not None  # hard attention's REINFORCE terms
    return DecoderOutput(logits, torch.stack([x.alpha for x in atts], 1), torch.stack(betas, 1),
                         torch.stack([x.log_prob for x in atts], 1) if sampled else None,  # type: ignore[misc]
                         torch.stack([x.entropy for x in atts], 1) if sampled else None)  # type: ignore[misc]


class ShowAttendTellDecoder(nn.Module):
    """LSTM decoder of Xu et al. (2015) with pluggable attention."""

    rows_share_images = True  # step() takes a, keys, mask per image with k state rows each (see decoding.py)

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, init_layers: Size = 1,
                 selector: bool = True, dropout: DropoutRate = 0.1, init_from_annotations: bool = True):
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
        return annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)

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
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image.

        lengths (N,): real target tokens per caption (`packing.prefix_lengths`); a caption runs only its own steps
        and the logits are (R, V) for its real tokens only. Without lengths every caption runs all T steps.
        """
        keys = self.attention.prepare(a, grid)  # (B, L, A): once per image, before expanding to captions
        a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
        plan = StepPlan.of(lengths, a.shape[0], k, captions.shape[1] - 1)
        a, keys, mask = plan.order_images(a, keys, mask)  # images by longest caption, longest first
        h, c, prev_alpha = repeat_rows(self.init_state(a, mask), k)  # (N, n), (N, n), (N, L)
        a = autocast_input(a)  # bf16/fp16: cast once, not at every step
        emb, emb_out = plan.embed(self.embed, captions[:, :-1])  # (sum_t n_t, m) step-major; per token
        lstm = UnrolledLSTM(self.lstm, emb, plan.counts)
        hs, zs, alphas, betas = [], [], [], []
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for t in range(plan.steps):
            b, rows = plan.images[t], plan.rows[t]
            h, c, prev_alpha = h[: b * k], c[: b * k], prev_alpha[: b * k]  # the images still running
            att, z, beta = self.attend(a[:b], keys[:b], (h, c, prev_alpha), None if mask is None else mask[:b])
            prev_alpha = att.alpha
            if rows is None:
                h, c = lstm(t, z, h, c)  # (n_t, n)
                h_t, run = h, att
            else:  # only the captions still running; the others' states stay as they were
                z, beta = z[rows], beta[rows]
                h_t, c_t = lstm(t, z, h[rows], c[rows])  # (n_t, n)
                h, c = h.index_copy(0, rows, h_t), c.index_copy(0, rows, c_t)
                run = att.select(rows)
            hs.append(h_t)
            zs.append(z)
            alphas.append(run.alpha)
            betas.append(beta)
            if run.log_prob is not None and run.entropy is not None:
                log_probs.append(run.log_prob)
                entropies.append(run.entropy)
        logits = self.output(emb_out, plan.tokens(hs), plan.tokens(zs))  # (N, T, V) or (R, V) in one matmul
        return DecoderOutput(
            logits=logits if lengths is None else logits.reshape(-1, logits.shape[-1]),
            alphas=plan.padded(alphas),  # (N, T, L)
            betas=plan.padded(betas),  # (N, T)
            log_probs=plan.padded(log_probs) if log_probs else None,
            entropies=plan.padded(entropies) if entropies else None,
        )

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """The paper's teacher forcing written out step by step: `forward` computes the same logits, alphas and
        gradients (to float rounding) and draws the same random numbers; tests/models/test_fast_path.py compares."""
        a, keys, mask = plain_rows(a, self.attention.prepare(a, grid), mask, image_index)  # (N, L, D), (N, L, A)
        state = self.init_state(a, mask)
        emb = self.embed(captions[:, :-1])  # (N, T, m)
        hs, zs, atts, betas = [], [], [], []
        for t in range(emb.shape[1]):
            att, z, beta = self.attend(a, keys, state, mask)  # alpha_t and z_t from h_{t-1}
            h, c = self.lstm(torch.cat([emb[:, t], z], dim=1), state[:2])  # (N, n)
            state = (h, c, att.alpha)
            hs.append(h)
            zs.append(z)
            atts.append(att)
            betas.append(beta)
        return plain_output(self.output(emb, torch.stack(hs, 1), torch.stack(zs, 1)), atts, betas)
