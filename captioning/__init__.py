"""Show, Attend and Tell: attention-based image captioning."""

__version__ = "0.1.0"
