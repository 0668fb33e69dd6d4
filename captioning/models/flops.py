"""Matmul FLOPs of the paper's decoder (`ShowAttendTellDecoder` with `SoftAttention`), for benchmarks.

Counted as `torch.utils.flop_counter.FlopCounterMode` counts a plain implementation (nn.LSTMCell, nn.Linear):
2 M N K per GEMM, forward and backward; element-wise work (tanh, softmax, the LSTM gates, Adam) is not counted.
A backward pass costs two GEMMs per forward GEMM (input and weight gradient), except where the input needs no
gradient: the annotations a, so W_a a_i, the first init layer and the context sum_i alpha_i a_i get one.
The count depends on the model, not on how `forward` organises it (tests/models/test_fast_path.py checks it against
FlopCounterMode on a plain step-by-step implementation).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderSizes:
    """The sizes that decide the decoder's FLOPs (symbols of the paper: L regions of D dims, m, n, A, V)."""

    vocab_size: int  # V
    annotation_dim: int  # D
    regions: int  # L
    embed_dim: int  # m
    hidden_dim: int  # n
    attention_dim: int  # A
    init_layers: int = 1
    selector: bool = True
    init_from_annotations: bool = True


def _per_image(s: DecoderSizes, backward: bool) -> int:
    """W_a a_i and the init MLPs of h_0 and c_0, for one image (forward, or forward + backward)."""
    D, L = s.annotation_dim, s.regions
    keys = 2 * L * D * s.attention_dim  # W_a a_i
    init = 0
    if s.init_from_annotations:
        hidden, last = (s.init_layers - 1) * 2 * D * D, 2 * D * s.hidden_dim
        first = hidden if s.init_layers > 1 else last  # the layer that reads mean_i a_i: no input gradient
        init = 2 * (hidden + last)  # h_0 and c_0
        if backward:
            init += 2 * (2 * (hidden + last) - first)
    return keys * (2 if backward else 1) + init


def _per_row_step(s: DecoderSizes, backward: bool) -> int:
    """One caption (or beam) row for one step: attention, gate, LSTM and the deep output layer."""
    D, L, m, n, A, V = s.annotation_dim, s.regions, s.embed_dim, s.hidden_dim, s.attention_dim, s.vocab_size
    with_grads = (2 * n * A  # W_h h_{t-1}
                  + 2 * L * A  # w^T tanh(...)
                  + (2 * n if s.selector else 0)  # beta_t
                  + 2 * (m + D + n) * 4 * n  # LSTM: [E y; z] W_ih^T + h W_hh^T
                  + 2 * (n + D) * m + 2 * m * V)  # deep output: L_h h, L_z z, L_o
    context = 2 * L * D  # sum_i alpha_i a_i; a needs no gradient
    return (3 * with_grads + 2 * context) if backward else (with_grads + context)


def teacher_forcing_flops(s: DecoderSizes, images: int, captions: int, steps: int, backward: bool = False) -> int:
    """FLOPs of `forward` over `captions` captions of `steps` steps on `images` grids (+ backward if asked)."""
    return images * _per_image(s, backward) + captions * steps * _per_row_step(s, backward)


def decoding_flops(s: DecoderSizes, images: int, row_steps: int) -> int:
    """FLOPs of decoding `images` grids where `row_steps` rows (images or beams) ran one `step` each in total."""
    return images * _per_image(s, False) + row_steps * _per_row_step(s, False)
