"""The models: encoders, attention types, decoders, decoding. `monotonic_attention` is TensorFlow's monotonic alignment
(captioning.models.monotonic), public for use outside the toolkit's decoders."""

from captioning.models.monotonic import monotonic_attention

__all__ = ["monotonic_attention"]
