"""The Transformer's parts (Vaswani et al. 2017), pre-norm as in the Annotated Transformer that ruotianluo's
TransformerModel builds on: each sub-layer computes x + dropout(sublayer(LayerNorm(x))), and a stack ends in a
LayerNorm of its own.

    SelfAttention     multi-head scaled dot-product attention of a sequence over itself (causal or padded keys),
                      and one incremental step over a key/value cache
    FeedForward       W_2 dropout(ReLU(W_1 x))
    EncoderLayer      self-attention over the L regions, then feed-forward
    DecoderLayer      masked self-attention over the words so far, cross-attention over the regions, feed-forward
    AnnotationMemory  the decoder's `attention`: the annotations projected to d_model, the optional encoder stack,
                      and each decoder layer's cross-attention with its keys prepared once per image

The cross-attention of every decoder layer is an attention module of conf/attention/ (the `attention` group), built
with annotation_dim = hidden_dim = d_model: attention=multihead is Vaswani's; soft, dot, general, concat and local
scores fit too. Each is called with the rows of all positions of an image at once, (N T, d) queries for N captions of
T words (k T consecutive rows per image), or (N, d) at one decoding step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from captioning.models.attention import Attention, AttentionOutput, HardAttention, attention_name
from captioning.models.attention_family import MeanAttention, grid_positions, resolve_grid

Cache = tuple[torch.Tensor, torch.Tensor]  # keys, values of the words so far: (N, H, t, d_k) each


def sinusoid(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Vaswani's positions: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...): (T,) -> (T, d)."""
    i = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)  # (d/2,)
    angle = positions.float().unsqueeze(1) * torch.exp(i * (-math.log(10000.0) / d_model))  # (T, d/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=2).flatten(1)  # (T, d/2, 2) -> sin, cos interleaved
    return pe[:, :d_model]  # (T, d)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention: softmax(q k^T / sqrt(d_k)) v per head, heads concatenated, W_o."""

    def __init__(self, d_model: int, num_heads: int, dropout: float):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        self.num_heads, self.dropout = num_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (N, H, T, d_k) of x (N, T, d)."""
        N, T, d = x.shape
        q, k, v = self.qkv(x).view(N, T, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _merge(self, heads: torch.Tensor) -> torch.Tensor:
        """(N, H, T, d_k) -> W_o [head_1; ...; head_H] (N, T, d)."""
        N, H, T, dk = heads.shape
        return self.out(heads.transpose(1, 2).reshape(N, T, H * dk))

    def forward(self, x: torch.Tensor, causal: bool = False, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (N, T, d): each position over every position (causal: over itself and those before it only;
        key_mask (N, T): false at padded positions, which get no weight)."""
        q, k, v = self._split(x)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (N, 1, 1, T)
        p = self.dropout if self.training else 0.0
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal))

    def step(self, x: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
        """One new position x (N, d) over the cached ones and itself: O(t) for t cached positions, not a re-run."""
        q, k, v = self._split(x.unsqueeze(1))  # (N, H, 1, d_k) each
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (N, H, t + 1, d_k)
        p = self.dropout if self.training else 0.0
        return self._merge(F.scaled_dot_product_attention(q, k, v, dropout_p=p)).squeeze(1), (k, v)


class MemorySelfAttention(SelfAttention):
    """M2's memory-augmented self-attention (Cornia et al. 2020): keys [W_k X; M_k] and values [W_v X; M_v] with
    `slots` learnable memory rows M_k, M_v (each head its part), which every region may attend to. As the authors'
    code: M_k scaled by sqrt(d_k) and M_v by sqrt(m), drawn from N(0, 1/d_k) and N(0, 1/m)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float, slots: int):
        super().__init__(d_model, num_heads, dropout)
        self.slots, self.d_k = slots, d_model // num_heads
        self.m_k = nn.Parameter(torch.randn(slots, d_model) / math.sqrt(self.d_k))
        self.m_v = nn.Parameter(torch.randn(slots, d_model) / math.sqrt(slots))
        self.share: torch.Tensor | None = None  # the last training batch's mean weight on the slots (`Decoder.stats`)

    def _memory(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """M_k, M_v (n, H, m, d_k) for n sequences."""
        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(1, self.slots, self.num_heads, self.d_k).transpose(1, 2).expand(n, -1, -1, -1)
        return heads(math.sqrt(self.d_k) * self.m_k), heads(math.sqrt(self.slots) * self.m_v)

    def weights(self, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights (N, H, T, T + m) of queries q (N, H, T, d_k) over the keys k (N, H, T, d_k) of the
        regions, then the memory slots."""
        m_k, _ = self._memory(q.shape[0])
        scores = q @ torch.cat([k, m_k.to(k.dtype)], dim=2).transpose(-1, -2) / math.sqrt(self.d_k)
        if key_mask is not None:
            keep = F.pad(key_mask, (0, self.slots), value=True)[:, None, None, :]  # (N, 1, 1, T + m)
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1)

    def forward(self, x: torch.Tensor, causal: bool = False, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (N, T, d) over its T positions (key_mask (N, T): false at padded ones) and the m memory slots."""
        q, k, v = self._split(x)
        if self.training:  # the weight on the memory slots, per real query, for the training log (no gradient)
            with torch.no_grad():
                on_memory = self.weights(q, k, key_mask)[..., k.shape[2]:].sum(-1).mean(1)  # (N, T)
                real = torch.ones_like(on_memory, dtype=torch.bool) if key_mask is None else key_mask
                self.share = on_memory[real].mean()
        m_k, m_v = self._memory(x.shape[0])
        k, v = torch.cat([k, m_k.to(k.dtype)], dim=2), torch.cat([v, m_v.to(v.dtype)], dim=2)  # (N, H, T + m, d_k)
        mask = None if key_mask is None else F.pad(key_mask, (0, self.slots), value=True)[:, None, None, :]
        p = self.dropout if self.training else 0.0
        return self._merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p))


class FeedForward(nn.Module):
    """W_2 dropout(ReLU(W_1 x + b_1)) + b_2."""

    def __init__(self, d_model: int, ff_dim: int, dropout: float):
        super().__init__()
        self.w_1, self.w_2, self.dropout = nn.Linear(d_model, ff_dim), nn.Linear(ff_dim, d_model), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class EncoderLayer(nn.Module):
    """x + SelfAttention(LN(x)), then x + FeedForward(LN(x)), over the L regions of each image."""

    def __init__(self, d_model: int, num_heads: int, ff_dim: int, dropout: float, memory_slots: int = 0):
        super().__init__()
        self.self_attn = (SelfAttention(d_model, num_heads, dropout) if memory_slots == 0
                          else MemorySelfAttention(d_model, num_heads, dropout, memory_slots))
        self.ff = FeedForward(d_model, ff_dim, dropout)
        self.norm1, self.norm2, self.dropout = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x (B, L, d), mask (B, L) false at padded regions."""
        x = x + self.dropout(self.self_attn(self.norm1(x), key_mask=mask))
        return x + self.dropout(self.ff(self.norm2(x)))


class DecoderLayer(nn.Module):
    """x + SelfAttention(LN(x)) (masked), x + CrossAttention(LN(x), regions), x + FeedForward(LN(x))."""

    def __init__(self, d_model: int, num_heads: int, ff_dim: int, dropout: float):
        super().__init__()
        self.self_attn, self.ff = SelfAttention(d_model, num_heads, dropout), FeedForward(d_model, ff_dim, dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def cross(self, x: torch.Tensor, attend: Callable[[torch.Tensor], AttentionOutput]) -> tuple[torch.Tensor,
                                                                                                AttentionOutput]:
        """x + CrossAttention(LN(x)) and the attention's output, for x (..., d) with rows as `attend` takes them."""
        att = attend(self.norms[1](x).reshape(-1, x.shape[-1]))  # (rows, d) queries
        return x + self.dropout(att.context.view(x.shape)), att

    def forward(self, x: torch.Tensor, attend: Callable[[torch.Tensor], AttentionOutput],
                key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, AttentionOutput]:
        """Teacher forcing: x (N, T, d), every position at once (causal self-attention)."""
        x = x + self.dropout(self.self_attn(self.norms[0](x), causal=True))
        x, att = self.cross(x, attend)
        return x + self.dropout(self.ff(self.norms[2](x))), att

    def step(self, x: torch.Tensor, cache: Cache,
             attend: Callable[[torch.Tensor], AttentionOutput]) -> tuple[torch.Tensor, Cache, AttentionOutput]:
        """One position x (N, d) given the cached keys and values of the positions before it."""
        y, cache = self.self_attn.step(self.norms[0](x), cache)
        x, att = self.cross(x + self.dropout(y), attend)
        return x + self.dropout(self.ff(self.norms[2](x))), cache, att


def check_cross_attention(module: Attention, keys: torch.Tensor) -> None:
    """Refuse the attention types a Transformer layer cannot run in parallel over positions; `keys` is what the
    module's `prepare` gave for a probe (its layout)."""
    others = "use attention=multihead (Vaswani's), soft, dot, general, concat or local"
    if isinstance(module, MeanAttention):
        raise ValueError("decoder=transformer cannot use attention=mean: its cross-attention's query (and that "
                         "sublayer's LayerNorm) would learn nothing, and its self-attention stays; the no-attention "
                         f"control is for the LSTM decoders (sat, luong, updown); {others}")
    if isinstance(module, HardAttention):
        raise ValueError("decoder=transformer cannot use attention=hard: it samples one region per layer and step, "
                         f"which teacher forcing over all positions at once does not do; {others}")
    name = attention_name(module)
    if module.reads_previous:
        raise ValueError(f"decoder=transformer cannot use attention={name}{module.reads_previous_because()}: its "
                         f"weights read the previous step's, which teacher forcing over all positions at once does "
                         f"not have; {others}")
    if keys.dim() != 3:
        raise ValueError(f"decoder=transformer cannot use attention={name}: its keys are laid out on the (h, w) grid, "
                         f"which the Transformer's memory (a sequence of regions) does not keep; {others}")


RegionPositions = Literal["none", "sinusoidal", "learned"]


class AnnotationMemory(nn.Module):
    """The decoder's `attention`: what every step reads of the image, prepared once per image.

    prepare(a, grid) -> keys (B, L, d + sum_i A_i): the memory m = Encoder(dropout(ReLU(W_a a + b) + P)) (d_model
    wide; the encoder stack is optional, `encoder_layers` = 0 leaves m = dropout(ReLU(W_a a + b) + P)) followed by
    each decoder layer's cross-attention keys prepared from m (A_i wide).

    P is each region's 2-D position on the (h, w) grid, `region_positions`: none (P = 0: the regions are a set, and
    permuting them only permutes m, so the captions do not change), sinusoidal (DETR's 2-D scheme: the first
    ceil(d/2) channels Vaswani's sinusoid of the row, the other floor(d/2) that of the column; any grid), or learned
    (a row embedding and a column embedding of those widths, grids up to `max_grid_side` a side).
    """

    def __init__(self, annotation_dim: int, d_model: int, attention: Callable[..., Attention], num_layers: int,
                 encoder_layers: int, num_heads: int, ff_dim: int, dropout: float,
                 region_positions: RegionPositions = "none", max_grid_side: int = 32, memory_slots: int = 0,
                 mesh: bool = False):
        super().__init__()
        self.levels = encoder_layers if mesh and encoder_layers else 1  # memories kept: M2's mesh keeps each layer's
        self.d_model, self.region_positions, self.max_grid_side = d_model, region_positions, max_grid_side
        self.embed = nn.Sequential(nn.Linear(annotation_dim, d_model), nn.ReLU(), nn.Dropout(dropout))
        if region_positions == "learned":
            self.row_embed = nn.Embedding(max_grid_side, d_model - d_model // 2)
            self.col_embed = nn.Embedding(max_grid_side, d_model // 2)
        self.encoder = nn.ModuleList(EncoderLayer(d_model, num_heads, ff_dim, dropout, memory_slots)
                                     for _ in range(encoder_layers))
        self.norm = nn.LayerNorm(d_model) if encoder_layers else None
        cross = [attention(annotation_dim=d_model, hidden_dim=d_model) for _ in range(num_layers)]
        with torch.no_grad():  # each layer's keys for a probe: their layout and width (no random numbers drawn)
            probe = torch.zeros(1, 1, d_model)
            probed = [m.prepare(probe, (1, 1)) for m in cross]
        for module, keys in zip(cross, probed):
            check_cross_attention(module, keys)
        self.widths = [d_model, *(int(keys.shape[-1]) for keys in probed)]
        self.cross = nn.ModuleList(cross)

    def begin_batch(self) -> None:
        """Nothing to draw per batch (the trainer calls this for hard attention)."""

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """keys (B, L, d + sum_i A_i) for annotations a (B, L, D): the memory, then each layer's keys of it (with the
        mesh, that for each encoder layer's output, each through the stack's final LayerNorm: `levels` times)."""
        m = self.embed[1](self.embed[0](a))  # (B, L, d)
        if self.region_positions != "none":
            m = m + self.positions(a.shape[1], grid).to(m.dtype)
        m = self.embed[2](m)  # dropout
        outputs = []
        for layer in self.encoder:
            m = layer(m, mask)
            outputs.append(m)
        memories = outputs[-self.levels:] if outputs else [m]
        memories = [self.norm(x) for x in memories] if self.norm is not None else memories
        return torch.cat([part for x in memories for part in
                          (x, *(self.layer(i).prepare(x, grid, mask) for i in range(len(self.cross))))], dim=-1)

    def positions(self, num_regions: int, grid: tuple[int, int] | None) -> torch.Tensor:
        """P (L, d): the row part then the column part of each region's position on the grid (see the class)."""
        h, w = resolve_grid(num_regions, grid)
        device = next(self.parameters()).device
        rows, cols = grid_positions(h, w, device, torch.long).unbind(1)  # (L,) each
        if self.region_positions == "sinusoidal":
            half = self.d_model // 2
            return torch.cat([sinusoid(rows, self.d_model - half), sinusoid(cols, half)], dim=1)
        if max(h, w) > self.max_grid_side:
            raise ValueError(f"a {h} x {w} grid is larger than the learned region positions "
                             f"(decoder.max_grid_side={self.max_grid_side}): raise it, or use "
                             f"decoder.region_positions=sinusoidal")
        return torch.cat([self.row_embed(rows), self.col_embed(cols)], dim=1)

    def layer(self, i: int) -> Attention:
        """Decoder layer i's cross-attention module."""
        module = self.cross[i]
        assert isinstance(module, Attention)
        return module

    def split(self, keys: torch.Tensor) -> list[torch.Tensor]:
        """The memory (B, L, d) and each layer's keys (B, L, A_i) of `prepare`'s output (with the mesh: those of each
        encoder layer's memory in turn, `levels` times)."""
        return list(keys.split(self.widths * self.levels, dim=-1))
