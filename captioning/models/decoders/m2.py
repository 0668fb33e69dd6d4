"""The meshed-memory Transformer (Cornia et al., CVPR 2020, M2), `decoder=m2`: the Transformer with two changes.

    memory:  the encoder's self-attention over the regions X attends to keys [W_k X; M_k] and values [W_v X; M_v],
             m learnable slots M_k, M_v (transformer_layers.MemorySelfAttention; the survey's memory-network
             class): a-priori knowledge no region holds
    mesh:    each decoder layer reads every encoder layer's output X~^j (through the stack's final LayerNorm), not
             the last one only: sum_j sigmoid(W_j [Y; C(X~^j, Y)] + b_j) * C(X~^j, Y) / sqrt(N), C the layer's
             cross-attention (the same module for every j), Y its queries (`transformer.meshed`)

Everything else is `TransformerDecoder` (positions, the key/value cache in decoding, figures from the cross-attention
map: with the mesh, each encoder layer's map weighted by its gate's mean; `map_layer` and `map_head` select as for
the Transformer). It keeps this toolkit's pre-norm layers (the authors' code is post-norm), so that with
`memory_slots=0` and `mesh=false` it is the Transformer, weight for weight (tests/models/test_zoo.py); the paper's
sizes are N = 3 encoder and decoder layers, d = 512, 8 heads, m = 40 slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from captioning.base.constraints import Count, DropoutRate, Size, constrained
from captioning.models.attention import Attention
from captioning.models.decoders.transformer import TransformerDecoder
from captioning.models.decoders.transformer_layers import MemorySelfAttention, RegionPositions


class M2Decoder(TransformerDecoder):
    """The Transformer with memory slots in its encoder and meshed cross-attention (see the module); its defaults
    are conf/decoder/m2.yaml's."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 d_model: Size = 128, num_layers: Size = 2, num_heads: Size = 4, ff_dim: Size = 512,
                 encoder_layers: Count = 2, dropout: DropoutRate = 0.1,
                 positions: Literal["sinusoidal", "learned"] = "sinusoidal", max_positions: Size = 64,
                 tie_embeddings: bool = False, map_layer: int = -1, map_head: int | None = None,
                 region_positions: RegionPositions = "none", max_grid_side: Size = 32, memory_slots: Count = 8,
                 mesh: bool = True):
        super().__init__(vocab_size, annotation_dim, attention, d_model, num_layers, num_heads, ff_dim, encoder_layers,
                         dropout, positions, max_positions, tie_embeddings, map_layer, map_head, region_positions,
                         max_grid_side, memory_slots, mesh)

    def stats(self) -> dict[str, float]:
        """memory_share: the mean weight the encoder's real regions gave the memory slots in the last training batch
        (over layers, heads and regions); in the training log, history.json and TensorBoard."""
        shares = [m.share for m in self.modules() if isinstance(m, MemorySelfAttention) and m.share is not None]
        return {"memory_share": float(torch.stack(shares).mean())} if shares else {}
