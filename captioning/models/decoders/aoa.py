"""Attention on Attention (Huang et al., ICCV 2019, AoANet), `decoder=aoa`.

    AoA(f, Q) = sigmoid(W_g [f; Q] + b_g) * (W_i [f; Q] + b_i)       the attention gate times the information vector,
                                                                    f = f_att(Q, K, V) an attention's result
    Refiner (per image):  A_0 = ReLU(W_a a + b_a),  A_{l+1} = LayerNorm(A_l + AoA(MultiHead(A_l, A_l, A_l), A_l))
    Decoder:  h_t, c_t = LSTM([E y_{t-1}; mean_i A'_i + ctx_{t-1}], (h_{t-1}, c_{t-1}))
              ctx_t = AoA(f_att(h_t, A', A'), h_t)                 (ctx_0 = 0)
              p(y_t | I, y_<t) = softmax(W_p dropout(ctx_t))

f_att in the decoder is the `attention` group's module over the refined A' from the current h_t: attention=multihead
is the paper's (conf/decoder/aoa.yaml selects it); every other conf/attention/ type fits too. Its map is what figures
and attention correctness read. The refiner's self-attention is the Transformer's multi-head attention
(transformer_layers.SelfAttention, padded regions masked); `refiner_layers` = 0 leaves A' = A_0. The paper's COCO
model: 1024 wide, 8 heads, 6 refiner layers. With the gate forced open (sigmoid = 1), AoA is W_i [f; Q] + b_i: the
plain attention plus the information term (tests/models/test_zoo.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import Count, DropoutRate, Size, constrained
from captioning.models.attention import Attention
from captioning.models.decoders.base import mean_annotation
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.transformed import Projection, TransformedAttention
from captioning.models.decoders.transformer_layers import SelfAttention
from captioning.models.decoders.unroll import Step, StepIO
from captioning.models.rows import repeat_rows, rows_per_image

AoAState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # h, c, ctx (N, n), previous alpha (N, L)


class AoA(nn.Module):
    """AoA(f, Q) = sigmoid(W_g [f; Q] + b_g) * (W_i [f; Q] + b_i): (..., f_dim), (..., q_dim) -> (..., out_dim)."""

    def __init__(self, f_dim: int, q_dim: int, out_dim: int):
        super().__init__()
        self.W_i = nn.Linear(f_dim + q_dim, out_dim)  # the information vector
        self.W_g = nn.Linear(f_dim + q_dim, out_dim)  # the attention gate

    def forward(self, f: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        x = torch.cat([f, q], dim=-1)
        return torch.sigmoid(self.W_g(x)) * self.W_i(x)


class RefinerLayer(nn.Module):
    """A <- LayerNorm(A + dropout(AoA(MultiHead(A, A, A), A))) over an image's L regions."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.self_attn, self.aoa = SelfAttention(width, heads, dropout), AoA(width, width, width)
        self.norm, self.dropout = nn.LayerNorm(width), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, L, width), mask (B, L) false at padded regions (they get no weight)."""
        return self.norm(x + self.dropout(self.aoa(self.self_attn(x, key_mask=mask), x)))


class Refiner(nn.Module):
    """A' = the refiner layers over A_0 = ReLU(W_a a + b_a): (B, L, D) -> (B, L, width)."""

    def __init__(self, annotation_dim: int, width: int, layers: int, heads: int, dropout: float):
        super().__init__()
        self.project = Projection(annotation_dim, width)
        self.layers = nn.ModuleList(RefinerLayer(width, heads, dropout) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.dropout(self.project(a, mask))
        for layer in self.layers:
            x = layer(x, mask)
        return x


class AoADecoder(RecurrentDecoder):
    """Huang et al. (2019): the AoA refiner over the regions, an LSTM, and AoA over the decoder's attention."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 128, refiner_layers: Count = 1, refiner_heads: Size = 4,
                 dropout: DropoutRate = 0.1):
        super().__init__()
        if hidden_dim % refiner_heads:
            raise ValueError(f"decoder.hidden_dim ({hidden_dim}) must be a multiple of decoder.refiner_heads "
                             f"({refiner_heads})")
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        refiner = Refiner(annotation_dim, hidden_dim, refiner_layers, refiner_heads, dropout)
        self.attention = TransformedAttention(annotation_dim, hidden_dim, refiner,
                                              attention(annotation_dim=hidden_dim, hidden_dim=hidden_dim))
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTMCell(embed_dim + hidden_dim, hidden_dim)  # [E y_{t-1}; mean A' + ctx_{t-1}]
        self.aoa = AoA(hidden_dim, hidden_dim, hidden_dim)  # over [f_att(h_t, A', A'); h_t]
        self.W_p = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> AoAState:
        """Zero h_0, c_0 and ctx_0; the previous alpha uniform over the real regions."""
        zeros = a.new_zeros(a.shape[0], self.hidden_dim)  # (N, n)
        return zeros, zeros.clone(), zeros.clone(), self.attention.initial_carry(mean_annotation(a, mask)[1])

    def recur(self, io: StepIO, state: AoAState, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """The LSTM on [E y_{t-1}; mean A' + ctx_{t-1}], f_att from h_t, ctx_t = AoA(f_att, h_t)."""
        h, c, ctx, prev_alpha = state
        refined, _ = self.attention.split(keys)  # (b, L, n)
        mean = repeat_rows(mean_annotation(refined, mask)[0], rows_per_image(keys.shape[0], h.shape[0]))  # (N, n)
        h_t, c_t = io.lstm(self.lstm, io.run(mean + ctx), io.run(h), io.run(c))  # (n_t, n)
        h = io.put(h, h_t)
        att = self.attention(a, keys, h, mask, prev_alpha)  # from h_t
        run = io.attention(att)
        ctx_t = self.aoa(run.context, h_t)  # (n_t, n)
        return Step((h, io.put(c, c_t), io.put(ctx, ctx_t), att.recurrent), run, (ctx_t,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_p dropout(ctx_t): (..., n) -> (..., V)."""
        return self.W_p(self.dropout(parts[0]))
