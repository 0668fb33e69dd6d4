"""Anderson et al. (2018)'s top-down attention decoder (`decoder=updown`), with any attention in conf/attention/.

Two stacked LSTMs (eqs. 2-7 of "Bottom-Up and Top-Down Attention for Image Captioning and VQA"): an attention LSTM
that sees the language LSTM's last state, the mean annotation and the previous word, attention from its state, and
a language LSTM that reads the context:

    x1_t = [h2_{t-1}; v_mean; W_e y_{t-1}],     h1_t, c1_t = AttLSTM(x1_t, (h1_{t-1}, c1_{t-1}))
    alpha_t, z_t = attention(a, h1_t)             Anderson's is attention=soft: w^T tanh(W_v v_i + W_h h1_t)
    h2_t, c2_t = LangLSTM([z_t; h1_t], (h2_{t-1}, c2_{t-1}))
    p(y_t | y_<t, a) = softmax(W_p dropout(h2_t))

v_mean = (1/L) sum_i a_i over the valid (unmasked) regions. The annotations a (B, L, D) here are the encoder's grid
features, L = h * w CNN regions; Anderson's bottom-up features (Faster R-CNN boxes, one vector per detected object)
are a data option for later, not in this toolkit yet: the decoder would take them unchanged (a region set and a
mask), but no data set provides them. The attention LSTM's input is ordered [W_e y_{t-1}; v_mean; h2_{t-1}] (the
paper's x1 reordered) so that its step-invariant part comes first and `forward` projects it for all steps at once.

The alpha that `step` returns with the logits of word y_t is the map computed from h1_t and used to produce y_t,
as in the Luong decoder. The interface is `ShowAttendTellDecoder`'s (`init_state`, `step`, `forward` ->
DecoderOutput), so decoding, training, hard attention's REINFORCE terms, self-critical sampling, export and
visualisation work unchanged. States start at zeros as in the paper (`init_from_annotations`: the MLP init of the
SAT decoder instead, for both LSTMs). There is no scalar gate: betas are 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.decoder import DecoderOutput, _mlp, annotation_state, mean_annotation, plain_output
from captioning.models.fused import UnrolledLSTM, autocast_input
from captioning.models.packing import StepPlan
from captioning.models.rows import images_and_rows, plain_rows, repeat_rows, rows_per_image

# h1, c1 (attention LSTM), h2, c2 (language LSTM) (N, n) each, previous alpha (N, L): batch first, so that beams and
# samples reorder each row. v_mean is not state: `step` reads it from a (an exported step graph cannot return an
# input unchanged, and it costs less than the step's context z_t = sum_i alpha_i a_i).
UpDownState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class UpDownDecoder(nn.Module):
    """Anderson et al. (2018) top-down decoder (attention LSTM + language LSTM) over annotation vectors a (B, L, D)."""

    rows_share_images = True  # step() takes a, keys, mask per image with k state rows each (see decoding.py)

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, dropout: DropoutRate = 0.1,
                 init_from_annotations: bool = False, init_layers: Size = 1):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)  # queried by h1_t
        self.embed = nn.Embedding(vocab_size, embed_dim)  # W_e
        # [h1_0; h2_0] and [c1_0; c2_0] from the mean annotation; the paper starts from zeros
        self.init_h = _mlp(annotation_dim, 2 * hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = _mlp(annotation_dim, 2 * hidden_dim, init_layers) if init_from_annotations else None
        self.att_lstm = nn.LSTMCell(embed_dim + annotation_dim + hidden_dim, hidden_dim)  # [W_e y; v_mean; h2]
        self.lang_lstm = nn.LSTMCell(annotation_dim + hidden_dim, hidden_dim)  # [z_t; h1_t]
        self.W_p = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> UpDownState:
        """Zero states (or tanh(MLP(v_mean))) of both LSTMs and a uniform previous alpha over valid regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, 2 * self.hidden_dim)  # (N, 2n) x 2
        h1, h2 = h.chunk(2, dim=1)  # (N, n) each
        c1, c2 = c.chunk(2, dim=1)
        return h1, c1, h2, c2, alpha0

    def output(self, h2: torch.Tensor) -> torch.Tensor:
        """logits = W_p dropout(h2_t): (..., n) -> (..., V)."""
        return self.W_p(self.dropout(h2))

    def advance(self, emb: torch.Tensor, v_mean: torch.Tensor, state: UpDownState, a: torch.Tensor,
                keys: torch.Tensor, mask: torch.Tensor | None) -> tuple[UpDownState, AttentionOutput]:
        """One step from the embedded previous words (N, m) and the rows' mean annotations (N, D): attention LSTM,
        attention from h1_t, language LSTM."""
        h1, c1, h2, c2, prev_alpha = state
        h1, c1 = self.att_lstm(torch.cat([emb, v_mean, h2], dim=1), (h1, c1))  # (N, m + D + n) -> (N, n)
        att = self.attention(a, keys, h1, mask, prev_alpha)  # from h1_t
        h2, c2 = self.lang_lstm(torch.cat([att.context, h1], dim=1), (h2, c2))  # (N, D + n) -> (N, n)
        return (h1, c1, h2, c2, att.alpha), att

    def step(self, words: torch.Tensor, state: UpDownState, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, UpDownState, AttentionOutput]:
        """One decoding step from the previous words (N,): logits (N, V) of y_t, the new state, y_t's attention.

        a (B, L, D) and mask (B, L) hold one image per k = N / B consecutive state rows (beams, samples)."""
        v_mean = mean_annotation(a, mask)[0]  # (B, D)
        v_mean = repeat_rows(v_mean, rows_per_image(a.shape[0], words.shape[0]))  # (N, D)
        state, att = self.advance(self.embed(words), v_mean, state, a, keys, mask)
        return self.output(state[2]), state, att

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image.

        Computes what `advance` does step by step, faster (see `captioning.models.decoder`): k captions per image
        share a and keys; the attention LSTM's step-invariant input [W_e y_{t-1}; v_mean] is projected for all
        steps in one GEMM; both LSTMs' weight gradients are one GEMM each over all steps (`UnrolledLSTM`; the
        language LSTM has no precomputed part); W_p runs once after the loop. Given lengths (N,), each step runs
        the captions still running only and the logits are (R, V), real tokens only.
        """
        keys = self.attention.prepare(a, grid)  # once per image, before expanding to captions
        a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
        plan = StepPlan.of(lengths, a.shape[0], k, captions.shape[1] - 1)
        a, keys, mask = plan.order_images(a, keys, mask)  # images by longest caption, longest first
        h1, c1, h2, c2, prev_alpha = repeat_rows(self.init_state(a, mask), k)  # (N, n) x 4, (N, L)
        v_mean = mean_annotation(a, mask)[0]  # (B, D)
        emb, _ = plan.embed(self.embed, captions[:, :-1])  # (sum_t n_t, m) step-major
        image = torch.cat([torch.arange(plan.images[t] * k, device=a.device) if r is None else r
                           for t, r in enumerate(plan.rows)]) // k  # (sum_t n_t,) the image of each computed row
        fixed = torch.cat([emb, v_mean.index_select(0, image).to(emb.dtype)], dim=1)  # (sum_t n_t, m + D)
        a = autocast_input(a)  # bf16/fp16: cast once, not at every step
        no_words = fixed.new_empty(fixed.shape[0], 0)  # (sum_t n_t, 0): nothing of the language LSTM's is fixed
        att_lstm = UnrolledLSTM(self.att_lstm, fixed, plan.counts)
        lang_lstm = UnrolledLSTM(self.lang_lstm, no_words, plan.counts)
        outs, alphas = [], []
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for t in range(plan.steps):
            b, rows = plan.images[t], plan.rows[t]
            h1, c1, h2, c2, prev_alpha = h1[: b * k], c1[: b * k], h2[: b * k], c2[: b * k], prev_alpha[: b * k]
            if rows is None:
                h1, c1 = att_lstm(t, h2, h1, c1)  # (n_t, n)
                h1_t = h1
            else:  # only the captions still running; the others' states stay as they were
                h1_t, c1_t = att_lstm(t, h2[rows], h1[rows], c1[rows])  # (n_t, n)
                h1, c1 = h1.index_copy(0, rows, h1_t), c1.index_copy(0, rows, c1_t)
            att = self.attention(a[:b], keys[:b], h1, None if mask is None else mask[:b], prev_alpha)  # from h1_t
            prev_alpha = att.alpha
            run = att if rows is None else att.select(rows)
            joint = torch.cat([run.context, h1_t], dim=1)  # (n_t, D + n)
            if rows is None:
                h2, c2 = lang_lstm(t, joint, h2, c2)  # (n_t, n)
                h2_t = h2
            else:
                h2_t, c2_t = lang_lstm(t, joint, h2[rows], c2[rows])  # (n_t, n)
                h2, c2 = h2.index_copy(0, rows, h2_t), c2.index_copy(0, rows, c2_t)
            outs.append(h2_t)
            alphas.append(run.alpha)
            if run.log_prob is not None and run.entropy is not None:
                log_probs.append(run.log_prob)
                entropies.append(run.entropy)
        logits = self.output(plan.tokens(outs))  # (N, T, V) or (R, V) in one matmul
        return DecoderOutput(
            logits=logits if lengths is None else logits.reshape(-1, logits.shape[-1]),
            alphas=plan.padded(alphas),  # (N, T, L)
            betas=plan.padded([x.new_ones(x.shape[0]) for x in alphas]),  # (N, T): no gate, 0 after the end
            log_probs=plan.padded(log_probs) if log_probs else None,
            entropies=plan.padded(entropies) if entropies else None,
        )

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """The top-down decoder's teacher forcing written out with `advance` step by step: `forward` computes the
        same, faster (tests/models/test_fast_path.py compares the two)."""
        a, keys, mask = plain_rows(a, self.attention.prepare(a, grid), mask, image_index)  # (N, L, D), (N, L, A)
        state, v_mean = self.init_state(a, mask), mean_annotation(a, mask)[0]  # ..., (N, D)
        emb = self.embed(captions[:, :-1])  # (N, T, m)
        h2s, atts = [], []
        for t in range(emb.shape[1]):
            state, att = self.advance(emb[:, t], v_mean, state, a, keys, mask)
            h2s.append(state[2])
            atts.append(att)
        betas = [torch.ones_like(x.alpha[:, 0]) for x in atts]  # no gate
        return plain_output(self.output(torch.stack(h2s, 1)), atts, betas)
