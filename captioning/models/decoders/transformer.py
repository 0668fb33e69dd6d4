"""A Transformer captioner's decoder (`decoder=transformer`), on the step interface of the paper's decoder.

Vaswani et al. (2017) as ruotianluo's TransformerModel uses it for captioning (the Annotated Transformer's code):
pre-norm layers (x + dropout(sublayer(LayerNorm(x))), each stack ending in a LayerNorm), word embeddings scaled by
sqrt(d_model) plus sinusoidal (or learned) positions, then N decoder layers of masked self-attention, cross-attention
over the annotations and a feed-forward block, then softmax(W_o LN(x)) (W_o tied to the embeddings or not). The
annotations a (B, L, D) are first projected to d_model (ReLU(W_a a + b), ruotianluo's att_embed) and optionally run
through `encoder_layers` layers of self-attention over the regions (his model has 6; 0 skips them), with each region's
2-D grid position added first (`region_positions`: none, as his grid-less region features; sinusoidal or learned, row
and column halves as DETR's: without them self-attention sees the grid as a set).

Cross-attention is the `attention` group's module (one per layer, see transformer_layers.py): attention=multihead
is Vaswani's (conf/decoder/transformer.yaml selects it). Its maps are what figures and attention correctness read:
the `map_layer`-th layer's (default the last), averaged over heads, or head `map_head` alone.

Teacher forcing (`forward`) runs all positions of all captions at once. Decoding runs `step`, whose state is each
layer's self-attention keys and values of the words so far (N, H, t, d_k): a step attends over the cache and adds
one position, O(t), instead of re-running the prefix. Beam search and greedy reorder and drop the cache's rows as
they do any state's. tests/models/test_transformer_decoder.py checks that the steps give forward's logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, cast

import torch
from torch import nn

from captioning.base.constraints import Count, DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.attention_family import MultiHeadAttention
from captioning.models.decoders.base import Decoder, DecoderOutput
from captioning.models.decoders.transformer_layers import (
    AnnotationMemory,
    Cache,
    DecoderLayer,
    RegionPositions,
    sinusoid,
)
from captioning.models.rows import images_and_rows, plain_rows

TransformerState = tuple[Cache, ...]  # per decoder layer: its self-attention keys and values (N, H, t, d_k) each


def meshed(outs: list[AttentionOutput], q: torch.Tensor, gates: nn.ModuleList) -> AttentionOutput:
    """M2's meshed cross-attention (Cornia et al. 2020, eq. 8-9): sum_j g_j * C_j / sqrt(N) with the gates
    g_j = sigmoid(W_j [Y; C_j] + b_j), for the N encoder layers' cross-attention results C_j (rows, d) and queries Y
    (rows, d) (the division by sqrt(N) as the authors' code). The map figures read: each layer's map weighted by
    its gate's mean, normalised (a distribution over the regions, as every map)."""
    g = [torch.sigmoid(gate(torch.cat([q, o.context.to(q.dtype)], dim=-1))) for gate, o in zip(gates, outs)]
    context = torch.stack([gj * o.context for gj, o in zip(g, outs)]).sum(0) / math.sqrt(len(outs))  # (rows, d)
    share = torch.stack([gj.mean(-1) for gj in g], dim=-1)  # (rows, N)
    share = share / share.sum(-1, keepdim=True)
    alpha = torch.stack([o.alpha for o in outs], dim=-1) @ share.unsqueeze(-1).to(outs[0].alpha.dtype)  # (rows, L, 1)
    heads = None
    if all(o.heads is not None for o in outs):
        stacked = torch.stack([o.heads for o in outs if o.heads is not None], dim=-1)  # (rows, H, L, N)
        heads = (stacked * share[:, None, None, :].to(stacked.dtype)).sum(-1)
    return AttentionOutput(context, alpha.squeeze(-1), heads=heads)


class TransformerDecoder(Decoder):
    """N Transformer decoder layers over the words so far and the image's annotation vectors a (B, L, D)."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 d_model: Size = 128, num_layers: Size = 2, num_heads: Size = 4, ff_dim: Size = 512,
                 encoder_layers: Count = 0, dropout: DropoutRate = 0.1,
                 positions: Literal["sinusoidal", "learned"] = "sinusoidal", max_positions: Size = 64,
                 tie_embeddings: bool = False, map_layer: int = -1, map_head: int | None = None,
                 region_positions: RegionPositions = "none", max_grid_side: Size = 32, memory_slots: Count = 0,
                 mesh: bool = False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"decoder.d_model ({d_model}) must be a multiple of decoder.num_heads ({num_heads})")
        self.vocab_size, self.d_model, self.num_heads = vocab_size, d_model, num_heads
        self.attention = AnnotationMemory(annotation_dim, d_model, attention, num_layers, encoder_layers, num_heads,
                                          ff_dim, dropout, region_positions, max_grid_side, memory_slots, mesh)
        self.embed = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_positions, d_model) if positions == "learned" else None
        self.max_positions = max_positions if positions == "learned" else None
        self.layers = nn.ModuleList(DecoderLayer(d_model, num_heads, ff_dim, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab_size)
        self.dropout = nn.Dropout(dropout)
        # M2's meshed cross-attention: per decoder layer, a gate sigmoid(W [Y; C_j] + b) for each encoder layer j's
        # memory (created last, so that without the mesh every other weight draws what it drew before)
        self.mesh_gates = nn.ModuleList(nn.ModuleList(nn.Linear(2 * d_model, d_model)
                                                      for _ in range(self.attention.levels))
                                        for _ in range(num_layers)) if mesh else None
        for p in self.parameters():  # the Annotated Transformer's (and ruotianluo's) initialisation
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        if tie_embeddings:
            self.out.weight = self.embed.weight  # one (V, d) matrix for the input words and the output softmax
        self.map_layer: int = 0
        self.map_head: int | None = None
        self.select_map(map_layer, map_head)

    def select_map(self, layer: int = -1, head: int | None = None) -> None:
        """Which cross-attention map decoding returns as alpha (figures, attention correctness): layer `layer`
        (negative counts from the last), averaged over heads, or head `head` of it (attention=multihead only)."""
        n = len(self.layers)
        if not -n <= layer < n:
            raise ValueError(f"attention map layer {layer} does not exist: the decoder has {n} layers "
                             f"(0..{n - 1}, or -1 for the last)")
        if head is not None:
            cross = self.attention.layer(layer)
            if not isinstance(cross, MultiHeadAttention):
                raise ValueError(f"an attention map head needs attention=multihead; this decoder's cross-attention "
                                 f"is {type(cross).__name__}, which has one map per layer")
            if not 0 <= head < cross.num_heads:
                raise ValueError(f"attention map head {head} does not exist: the cross-attention has "
                                 f"{cross.num_heads} heads (0..{cross.num_heads - 1})")
        self.map_layer, self.map_head = layer % n, head

    def _map(self, att: AttentionOutput) -> torch.Tensor:
        """alpha (rows, L) of the selected map: the layer's mean over heads, or one head's."""
        if self.map_head is None or att.heads is None:
            return att.alpha
        return att.heads[:, self.map_head]

    def _inputs(self, words: torch.Tensor, start: int) -> torch.Tensor:
        """dropout(sqrt(d) E y + PE(position)) for words (N, T) at positions start .. start + T - 1: (N, T, d)."""
        T = words.shape[1]
        if self.max_positions is not None and start + T > self.max_positions:
            raise ValueError(f"the decoder's learned positions stop at {self.max_positions} words; decoding or "
                             f"captions longer need a larger decoder.max_positions (or positions=sinusoidal)")
        pos = torch.arange(start, start + T, device=words.device)  # (T,)
        pe = sinusoid(pos, self.d_model) if self.positions is None else self.positions(pos)  # (T, d)
        return self.dropout(self.embed(words) * math.sqrt(self.d_model) + pe.to(self.embed.weight.dtype))

    def _attend(self, i: int, parts: list[torch.Tensor],
                mask: torch.Tensor | None) -> Callable[[torch.Tensor], AttentionOutput]:
        """Layer i's cross-attention as a function of its queries (rows, d), k rows per image of the memory
        (B, L, d); `parts` is `self.attention.split(keys)`: the memory, then each layer's keys of it."""
        cross, memory = self.attention.layer(i), parts[0]
        if self.mesh_gates is None:
            return lambda q: cross(memory, parts[1 + i], q, mask, None)
        width = 1 + len(self.layers)  # each encoder layer's memory, then each decoder layer's keys of it
        levels = [(parts[j * width], parts[j * width + 1 + i]) for j in range(self.attention.levels)]
        gates = cast(nn.ModuleList, self.mesh_gates[i])
        return lambda q: meshed([cross(m, k, q, mask, None) for m, k in levels], q, gates)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> TransformerState:
        """Empty caches: (N, H, 0, d_k) keys and values per layer."""
        empty = a.new_zeros(a.shape[0], self.num_heads, 0, self.d_model // self.num_heads)
        return tuple((empty, empty) for _ in self.layers)

    def step(self, words: torch.Tensor, state: TransformerState, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, TransformerState, AttentionOutput]:
        """One position from the previous words (N,): logits (N, V), the caches with it added, the selected map."""
        parts = self.attention.split(keys)  # the memory (B, L, d), per layer its keys (B, L, A_i)
        x = self._inputs(words.unsqueeze(1), state[0][0].shape[2]).squeeze(1)  # (N, d) at position t
        caches, chosen = [], None
        for i, layer in enumerate(self.layers):
            x, cache, att = cast(DecoderLayer, layer).step(x, state[i], self._attend(i, parts, mask))
            caches.append(cache)
            if i == self.map_layer:
                chosen = att
        assert chosen is not None
        return self.out(self.norm(x)), tuple(caches), AttentionOutput(chosen.context, self._map(chosen))

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>, all positions at once.

        a (B, L, D) holds one grid per image; image_index (N,) the image of each caption. Given lengths (N,) (real
        target tokens, `packing.prefix_lengths`) only the longest caption's positions run, and the logits are (R, V)
        for the real tokens, caption by caption (the other decoders' order).
        """
        keys = self.attention.prepare(a, grid, mask)  # (B, L, d + sum A_i) once per image
        a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
        words = captions[:, :-1]  # (N, T)
        if lengths is not None:
            words = words[:, : int(lengths.max())]  # positions after every caption's end are never read
        N, T = words.shape
        parts = self.attention.split(keys)
        x = self._inputs(words, 0)  # (N, T, d)
        chosen = None
        for i, layer in enumerate(self.layers):
            x, att = layer(x, self._attend(i, parts, mask))  # N T rows: k T per image
            if i == self.map_layer:
                chosen = att
        assert chosen is not None
        alphas = self._map(chosen).view(N, T, -1)  # (N, T, L)
        betas = alphas.new_ones(N, T)  # no gate
        if lengths is None:
            return DecoderOutput(self.out(self.norm(x)), alphas, betas)
        real = torch.arange(T, device=x.device) < lengths.unsqueeze(1)  # (N, T)
        logits = self.out(self.norm(x[real]))  # (R, V): the real tokens only, caption by caption
        width = captions.shape[1] - 1  # alphas and betas keep the captions' width, zero after each end
        alphas = torch.nn.functional.pad(alphas * real.unsqueeze(-1), (0, 0, 0, width - T))
        return DecoderOutput(logits, alphas, torch.nn.functional.pad(betas * real, (0, width - T)))

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """Teacher forcing written as decoding runs it, one `step` at a time over the cache (the tests compare)."""
        a, keys, mask = plain_rows(a, self.attention.prepare(a, grid, mask), mask, image_index)  # one copy per caption
        state = self.init_state(a, mask)
        logits, alphas = [], []
        for t in range(captions.shape[1] - 1):
            step_logits, state, att = self.step(captions[:, t], state, a, keys, mask)
            logits.append(step_logits)
            alphas.append(att.alpha)
        alpha = torch.stack(alphas, 1)  # (N, T, L)
        return DecoderOutput(torch.stack(logits, 1), alpha, alpha.new_ones(alpha.shape[:2]))
