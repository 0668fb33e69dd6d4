"""Luong et al. (2015)'s attentional LSTM decoder (`decoder=luong`), with any attention in conf/attention/.

Xu et al. attend from h_{t-1} and feed the context into the LSTM; Luong et al. attend after the LSTM step:

    h_t, c_t = LSTM([E y_{t-1}; h~_{t-1}], (h_{t-1}, c_{t-1}))     input feeding (h~_0 = 0); without it: E y_{t-1}
    alpha_t, z_t = attention(a, h_t)                                 every score (dot, general, concat, local-p, ...)
    h~_t = tanh(W_c [z_t; h_t])                                      the attentional state
    p(y_t | y_<t, a) = softmax(W_s dropout(h~_t))

So the alpha that `step` returns with the logits of word y_t is the map computed from h_t and used to produce
y_t, as for the paper's decoder (whose alpha for y_t comes from h_{t-1}): attention figures, the doubly
stochastic term and attention correctness read it the same way. The interface is `ShowAttendTellDecoder`'s
(`init_state`, `step`, `forward` -> DecoderOutput), so decoding, training, hard attention's REINFORCE terms,
feature caches and visualisation work unchanged. h_0, c_0 come from the mean annotation as in the paper (Luong
starts from the encoder's last state, which an image does not have). There is no scalar gate: betas are 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.decoder import DecoderOutput, _mlp, annotation_state, plain_output
from captioning.models.fused import UnrolledLinear, UnrolledLSTM, autocast_input
from captioning.models.packing import StepPlan
from captioning.models.rows import images_and_rows, plain_rows, repeat_rows

# h (N, n), c (N, n), attentional state h~ (N, n), previous alpha (N, L): batch first, so beams reorder each
LuongState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class LuongDecoder(nn.Module):
    """Luong et al. (2015) global/local attention decoder with input feeding, over annotation vectors a (B, L, D)."""

    rows_share_images = True  # step() takes a, keys, mask per image with k state rows each (see decoding.py)

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, init_layers: Size = 1, dropout: DropoutRate = 0.1,
                 init_from_annotations: bool = True, input_feeding: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_dim, self.input_feeding = vocab_size, hidden_dim, input_feeding
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.init_h = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.lstm = nn.LSTMCell(embed_dim + (hidden_dim if input_feeding else 0), hidden_dim)
        self.W_c = nn.Linear(annotation_dim + hidden_dim, hidden_dim, bias=False)  # Luong's W_c has no bias
        self.W_s = nn.Linear(hidden_dim, vocab_size)  # its bias is a word-frequency prior (Luong omits biases)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> LuongState:
        """h_0, c_0 from the mean annotation (or zeros), h~_0 = 0, and a uniform previous alpha over valid regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)
        return h, c, torch.zeros_like(h), alpha0

    def output(self, h_tilde: torch.Tensor) -> torch.Tensor:
        """logits = W_s dropout(h~_t): (..., n) -> (..., V)."""
        return self.W_s(self.dropout(h_tilde))

    def advance(self, emb: torch.Tensor, state: LuongState, a: torch.Tensor, keys: torch.Tensor,
                mask: torch.Tensor | None) -> tuple[LuongState, AttentionOutput]:
        """One LSTM step from the embedded previous words (N, m), then attention from h_t and h~_t."""
        h, c, h_tilde, prev_alpha = state
        x = torch.cat([emb, h_tilde], dim=1) if self.input_feeding else emb  # (N, m + n) or (N, m)
        h, c = self.lstm(x, (h, c))  # (N, n)
        att = self.attention(a, keys, h, mask, prev_alpha)  # from h_t, after the step
        h_tilde = torch.tanh(self.W_c(torch.cat([att.context, h], dim=1)))  # (N, D + n) -> (N, n)
        return (h, c, h_tilde, att.alpha), att

    def step(self, words: torch.Tensor, state: LuongState, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, LuongState, AttentionOutput]:
        """One decoding step from the previous words (N,): logits (N, V) of y_t, the new state, y_t's attention."""
        state, att = self.advance(self.embed(words), state, a, keys, mask)
        return self.output(state[2]), state, att

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image.

        Computes what `advance` does step by step, faster (see `captioning.models.decoder`): the word part of the
        LSTM input for all steps at once, k captions per image sharing a and keys, and the recurrent GEMMs'
        weight gradients (LSTM, and W_c with input feeding) one GEMM each over all steps. Without input feeding
        h~_t feeds nothing recurrent, so W_c runs once over all steps after the loop. Given lengths (N,), each
        step runs the captions still running only and the logits are (R, V), real tokens only (as in
        `ShowAttendTellDecoder.forward`).
        """
        keys = self.attention.prepare(a, grid)  # once per image, before expanding to captions
        a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
        plan = StepPlan.of(lengths, a.shape[0], k, captions.shape[1] - 1)
        a, keys, mask = plan.order_images(a, keys, mask)  # images by longest caption, longest first
        h, c, h_tilde, prev_alpha = repeat_rows(self.init_state(a, mask), k)  # (N, n) x 3, (N, L)
        a = autocast_input(a)  # bf16/fp16: cast once, not at every step
        emb, _ = plan.embed(self.embed, captions[:, :-1])  # (sum_t n_t, m) step-major
        lstm, w_c = UnrolledLSTM(self.lstm, emb, plan.counts), UnrolledLinear(self.W_c.weight, plan.steps)
        outs, alphas = [], []
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for t in range(plan.steps):
            b, rows = plan.images[t], plan.rows[t]
            h, c, h_tilde, prev_alpha = h[: b * k], c[: b * k], h_tilde[: b * k], prev_alpha[: b * k]
            fed = h_tilde if self.input_feeding else None
            if rows is None:
                h, c = lstm(t, fed, h, c)  # (n_t, n)
            else:  # only the captions still running; the others' states stay as they were
                h_t, c_t = lstm(t, None if fed is None else fed[rows], h[rows], c[rows])  # (n_t, n)
                h, c = h.index_copy(0, rows, h_t), c.index_copy(0, rows, c_t)
            att = self.attention(a[:b], keys[:b], h, None if mask is None else mask[:b], prev_alpha)  # from h_t
            prev_alpha = att.alpha
            run = att if rows is None else att.select(rows)
            joint = torch.cat([run.context, h if rows is None else h_t], dim=1)  # (n_t, D + n)
            if self.input_feeding:
                out = torch.tanh(w_c(t, joint))  # (n_t, n), fed to the next step
                h_tilde = out if rows is None else h_tilde.index_copy(0, rows, out)
            outs.append(out if self.input_feeding else joint)
            alphas.append(run.alpha)
            if run.log_prob is not None and run.entropy is not None:
                log_probs.append(run.log_prob)
                entropies.append(run.entropy)
        outs_t = plan.tokens(outs)  # (N, T, n) or (R, n), or before W_c (..., D + n)
        h_tildes = outs_t if self.input_feeding else torch.tanh(self.W_c(outs_t))  # (N, T, n) or (R, n)
        alphas_t = plan.padded(alphas)  # (N, T, L)
        logits = self.output(h_tildes)  # (N, T, V) or (R, V) in one matmul
        return DecoderOutput(
            logits=logits if lengths is None else logits.reshape(-1, logits.shape[-1]),
            alphas=alphas_t,
            betas=plan.padded([x.new_ones(x.shape[0]) for x in alphas]),  # (N, T): no gate, 0 after the end
            log_probs=plan.padded(log_probs) if log_probs else None,
            entropies=plan.padded(entropies) if entropies else None,
        )

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """Luong's teacher forcing written out with `advance` step by step: `forward` computes the same, faster
        (tests/models/test_fast_path.py compares the two)."""
        a, keys, mask = plain_rows(a, self.attention.prepare(a, grid), mask, image_index)  # (N, L, D), (N, L, A)
        state = self.init_state(a, mask)
        emb = self.embed(captions[:, :-1])  # (N, T, m)
        h_tildes, atts = [], []
        for t in range(emb.shape[1]):
            state, att = self.advance(emb[:, t], state, a, keys, mask)
            h_tildes.append(state[2])
            atts.append(att)
        betas = [torch.ones_like(x.alpha[:, 0]) for x in atts]  # no gate
        return plain_output(self.output(torch.stack(h_tildes, 1)), atts, betas)
