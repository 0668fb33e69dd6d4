"""Teacher forcing over real words only: which rows each step of the decoder computes.

A batch of captions is padded to its longest, but a caption of 9 words has no business at step 15. Given each
caption's length (its real target tokens, <end> included), `StepPlan` orders the images by their longest caption
(longest first) and each image's captions by length, so that at step t

- the images with a caption still running are the first b_t (a prefix: attention runs on a[:b_t], keys[:b_t]
  and their b_t k rows, k captions per image as everywhere in the decoders);
- `rows[t]` says which of those b_t k rows the LSTM, the gate and everything after attention run for: the
  captions still running (the other rows' states are left untouched), or None: all b_t k rows, when most of them
  still run (`GATHER_BELOW`; a caption that has ended then computes a step nobody reads);
- the deep output, the vocabulary projection and the loss see the real tokens only, gathered from the computed
  ones (`row_major`), never masked.

Without lengths, or when every caption fills the batch, the plan is dense: nothing is reordered or gathered and
the decoders compute what they computed before (logits (N, T, V)). With lengths the logits are (R, V), one row
per real token in the order of `dense_logits[targets != pad]` (caption by caption, step by step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Gather the captions still running when they are fewer than this share of the running images' rows; else run
# every row of those images (the rows of captions that have ended compute something nobody reads). A gather and
# scatter per step cost more than a few rows save on small models (measured in experiments/README.md, "Real
# caption lengths"); with one caption per image (k = 1) every running row is a running caption anyway.
GATHER_BELOW = 0.75


def prefix_lengths(targets: torch.Tensor, pad_id: int) -> torch.Tensor | None:
    """Real tokens per caption (N,) of targets (N, T) padded at the end, or None when some caption has a pad
    before a word (then only the dense, masked path computes the right thing)."""
    real = targets != pad_id  # (N, T)
    lengths = real.sum(dim=1)  # (N,)
    steps = torch.arange(targets.shape[1], device=targets.device)  # (T,)
    return lengths if torch.equal(real, steps < lengths.unsqueeze(1)) else None


@dataclass(frozen=True)
class StepPlan:
    """Rows per step for N = B k captions (k per image, image b owns rows b k .. b k + k - 1) of width T."""

    N: int
    T: int  # the captions' width: positions 0 .. T - 1 (tokens r T + t of the (N, T) inputs)
    k: int
    steps: int  # steps the loop runs: the longest caption's length
    images: list[int]  # b_t: images with a caption still running at step t
    rows: list[torch.Tensor | None]  # (n_t,) sorted rows computed among the first b_t k; None: all of them
    counts: list[int]  # n_t: rows computed at step t
    image_order: torch.Tensor | None = None  # (B,) image of each sorted image; None: as given
    packed_flat: torch.Tensor | None = None  # (P,) r T + t of each computed token, step-major; None: dense
    row_major: torch.Tensor | None = None  # (R,) position in the packing of each real token, in (r, t) order
    real_flat: torch.Tensor | None = None  # (R,) r T + t of each real token, in (r, t) order

    @property
    def dense(self) -> bool:
        """Every caption runs every step: nothing is gathered."""
        return self.packed_flat is None

    @classmethod
    def full(cls, B: int, k: int, T: int) -> StepPlan:
        """The dense plan: all B k captions for all T steps."""
        return cls(B * k, T, k, T, [B] * T, [None] * T, [B * k] * T)

    @classmethod
    def of(cls, lengths: torch.Tensor | None, B: int, k: int, T: int) -> StepPlan:
        """The plan for captions of these lengths (N,) (None: all T), k consecutive rows per image of B."""
        N = B * k
        if lengths is None or N == 0:
            return cls.full(B, k, T)
        if lengths.shape != (N,):
            raise ValueError(f"lengths must be one per caption, shape ({N},), got {tuple(lengths.shape)}")
        lens = lengths.detach().to("cpu", torch.long)  # one device sync per forward
        if int(lens.min()) < 0 or int(lens.max()) > T:
            raise ValueError(f"caption lengths must lie in [0, {T}], got {int(lens.min())}..{int(lens.max())}")
        if int(lens.max()) == 0:
            raise ValueError("no caption has a real token: lengths count the targets up to and with <end>")
        if bool((lens == T).all()):
            return cls.full(B, k, T)
        device = lengths.device
        per = lens.view(B, k)  # (B, k)
        longest = per.max(dim=1).values  # (B,)
        image_order = torch.sort(longest, descending=True, stable=True).indices  # (B,)
        within = torch.sort(per[image_order], dim=1, descending=True, stable=True)  # (B, k) each image's captions
        sorted_lens = within.values.reshape(-1)  # (N,) length of sorted row s
        row_order = (image_order.unsqueeze(1) * k + within.indices).reshape(-1)  # (N,) original row of sorted row s
        steps = int(longest.max())
        images = [int((longest > t).sum()) for t in range(steps)]
        rows: list[torch.Tensor | None] = []
        counts, flats, real = [], [], []
        for t, b in enumerate(images):
            running = sorted_lens[: b * k] > t  # (b k,) sorted rows of the running images: caption still running
            n = int(running.sum())
            if n < GATHER_BELOW * b * k:  # the running captions only
                computed = running.nonzero().squeeze(1)  # (n_t,)
                rows.append(computed.to(device))
                real.append(torch.ones(n, dtype=torch.bool))
            else:  # every row of the running images (a gather would cost more than the rows it saves)
                computed = torch.arange(b * k)
                rows.append(None)
                real.append(running)
            counts.append(computed.numel())
            flats.append(row_order[computed] * T + t)  # (n_t,) token r T + t of each computed row
        packed_flat, is_real = torch.cat(flats), torch.cat(real)  # (P,) step-major
        real_pos = is_real.nonzero().squeeze(1)  # (R,) positions of the real tokens in the packing
        real_pos = real_pos[torch.sort(packed_flat[real_pos]).indices]  # caption by caption, step by step
        identity = torch.equal(image_order, torch.arange(B))
        return cls(N, T, k, steps, images, rows, counts, None if identity else image_order.to(device),
                   packed_flat.to(device), real_pos.to(device), packed_flat[real_pos].to(device))

    def order_images(self, a: torch.Tensor, keys: torch.Tensor,
                     mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """a (B, L, D), keys (B, ...) and mask (B, L) in the plan's image order."""
        if self.image_order is None:
            return a, keys, mask
        order = self.image_order
        return a.index_select(0, order), keys.index_select(0, order), None if mask is None else mask[order]

    def embed(self, embedding: Callable[[torch.Tensor], torch.Tensor],
              words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The embedded input words (N, T): step-major for the LSTM (sum_t n_t, m) and per token for the deep output
        ((N, T, m) dense, (R, m) packed). Packed, only the computed rows' words are embedded."""
        if self.dense:
            emb = embedding(words)  # (N, T, m)
            return emb.transpose(0, 1).reshape(-1, emb.shape[-1]), emb  # (T N, m), (N, T, m)
        assert self.packed_flat is not None and self.row_major is not None
        emb = embedding(words.reshape(-1).index_select(0, self.packed_flat))  # (P, m) step-major
        return emb, emb.index_select(0, self.row_major)  # (R, m)

    def tokens(self, per_step: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-step outputs of the running captions [(n_t, ...)] as per-token rows: (N, T, ...) dense, (R, ...)
        packed in (caption, step) order."""
        if self.dense:
            return torch.stack(list(per_step), 1)  # (N, T, ...)
        assert self.row_major is not None
        return torch.cat(list(per_step)).index_select(0, self.row_major)  # (R, ...)

    def padded(self, per_step: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-step outputs [(n_t, ...)] as (N, T, ...) in the captions' own order, zero where a caption has ended."""
        if self.dense:
            return torch.stack(list(per_step), 1)  # (N, T, ...)
        assert self.row_major is not None and self.real_flat is not None
        packed = torch.cat(list(per_step)).index_select(0, self.row_major)  # (R, ...)
        out = packed.new_zeros((self.N * self.T, *packed.shape[1:]))  # (N T, ...)
        return out.index_copy(0, self.real_flat, packed).view(self.N, self.T, *packed.shape[1:])
