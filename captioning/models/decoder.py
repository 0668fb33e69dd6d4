"""The paper's LSTM decoder: MLP state init, attention with a scalar gate, LSTM, deep output layer.

`step` is one decoding step and `forward_plain` the paper's teacher forcing, both written plainly (decoding calls
`step`); `forward` computes what `forward_plain` does for all T steps, faster: what does not depend on the step is
computed once (W_a a_i, the word part of the LSTM input projection, the deep output), the k captions of an image
share its a and keys (no copies), the recurrent projection's weight gradient is one GEMM over all steps
(`fused.UnrolledLSTM`), and given the captions' lengths each step runs only the captions still running
(`captioning.models.packing`). tests/models/test_fast_path.py checks that both give the same logits, losses and
gradients.

The paper presets switch on what arctic-captions adds to the paper (experiments/README.md, "Fidelity"): dropout on
h_t before the deep output (`hidden_dropout`) and on the init MLP's hidden layer (`init_dropout`), and that hidden
layer's ReLU (`init_activation`). At their defaults they add no module and draw no random number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.fused import UnrolledLSTM, autocast_input
from captioning.models.packing import StepPlan
from captioning.models.rows import images_and_rows, plain_rows, repeat_rows

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # h (N, n), c (N, n), previous alpha (N, L)
InitActivation = Literal["tanh", "relu"]  # the init MLP's hidden layers


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions of T steps (given their lengths: zero after a caption's end)."""

    logits: torch.Tensor  # (N, T, V); given lengths (R, V), the R real tokens caption by caption
    alphas: torch.Tensor  # (N, T, L)
    betas: torch.Tensor  # (N, T)
    log_probs: torch.Tensor | None = None  # (N, T) log p(s_t | a) of sampled regions (hard attention)
    entropies: torch.Tensor | None = None  # (N, T) H(alpha_t) (hard attention)


def _mlp(in_dim: int, out_dim: int, layers: int, *, activation: InitActivation = "tanh",
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
                     init_c: nn.Module | None, hidden_dim: int) -> State:
    """h_0, c_0 = tanh(f_init(mean_i a_i)) (zeros without f_init); the previous alpha is uniform over valid regions."""
    mean, alpha0 = mean_annotation(a, mask)  # (N, D), (N, L)
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
    """LSTM decoder of Xu et al. (2015) with pluggable attention.

    `dropout` acts after the deep output's tanh, `hidden_dropout` on h_t where it enters the deep output (the
    recurrence keeps h_t), `init_dropout` after each hidden layer of the init MLPs, whose activation is
    `init_activation` (arctic-captions, `capgen.py`: L674-675, L685-686, L630-631 and the ReLU of L627-629).
    """

    rows_share_images = True  # step() takes a, keys, mask per image with k state rows each (see decoding.py)

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, init_layers: Size = 1,
                 selector: bool = True, dropout: DropoutRate = 0.1, init_from_annotations: bool = True,
                 hidden_dropout: DropoutRate = 0.0, init_dropout: DropoutRate = 0.0,
                 init_activation: InitActivation = "tanh"):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        # The paper initialises h_0, c_0 from the mean annotation; zeros is an ablation that makes every bit of
        # image information reach the decoder through attention.
        init = functools.partial(_mlp, annotation_dim, hidden_dim, init_layers, activation=init_activation,
                                 dropout=init_dropout)
        self.init_h = init() if init_from_annotations else None
        self.init_c = init() if init_from_annotations else None
        # With dropout in the init MLPs each caption draws its own mask (arctic-captions: each its own image copy).
        self.init_draws = init_from_annotations and init_layers > 1 and init_dropout > 0
        self.selector = nn.Linear(hidden_dim, 1) if selector else None  # beta_t, a scalar gate
        self.lstm = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.L_h = nn.Linear(hidden_dim, embed_dim)
        self.L_z = nn.Linear(annotation_dim, embed_dim)
        self.L_o = nn.Linear(embed_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)
        self.hidden_dropout = nn.Dropout(hidden_dropout) if hidden_dropout > 0 else None  # none at p = 0: no draws

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> State:
        """h_0, c_0 = tanh(f_init(mean_i a_i)) (or zeros); the previous alpha starts uniform over valid regions."""
        return annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)

    def init_rows(self, a: torch.Tensor, mask: torch.Tensor | None, k: int) -> State:
        """`init_state` for k rows per image of a (B, L, D): computed once per image and repeated (N = B k rows),
        unless the init MLPs drop units in training: then every row draws its own mask, as `forward_plain` does."""
        if k == 1 or not (self.training and self.init_draws):
            return repeat_rows(self.init_state(a, mask), k)
        assert self.init_h is not None and self.init_c is not None
        mean, alpha0 = repeat_rows(mean_annotation(a, mask), k)  # (N, D), (N, L)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean)), alpha0  # (N, n), (N, n), (N, L)

    def output(self, emb: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output: logits = L_o(dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t))), h_t through `hidden_dropout`."""
        if self.hidden_dropout is not None:
            h = self.hidden_dropout(h)  # (..., n): on the output's copy of h_t only, as capgen.py:L674-675
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
        h, c, prev_alpha = self.init_rows(a, mask, k)  # (N, n), (N, n), (N, L)
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
