"""Value checks of the soft-attention captioner: shapes, alpha normalisation, masks, gradients."""

import torch

from captioning.losses import caption_loss
from captioning.models.attention import SoftAttention


def _batch(B=3, caps_per_image=2, T=7, V=12):
    torch.manual_seed(1)
    images = torch.randn(B, 3, 32, 32)
    captions = torch.randint(4, V, (B * caps_per_image, T))
    captions[:, 0] = 1
    captions[0, 5:] = 0  # a padded caption
    return images, captions, torch.arange(B).repeat_interleave(caps_per_image)


def test_output_shapes_and_alphas_sum_to_one(tiny_model):
    images, captions, idx = _batch()
    a, grid = tiny_model.encode(images)
    assert a.shape == (3, 64, 16) and grid == (8, 8)  # (B, L, D)
    out = tiny_model(images, captions, idx)
    N, T = captions.shape[0], captions.shape[1] - 1
    assert out.logits.shape == (N, T, 12)
    assert out.alphas.shape == (N, T, 64)
    assert out.betas.shape == (N, T) and ((out.betas > 0) & (out.betas < 1)).all()
    torch.testing.assert_close(out.alphas.sum(-1), torch.ones(N, T))


def test_captions_of_one_image_share_its_encoding(tiny_model):
    images, captions, idx = _batch()
    tiny_model.eval()
    out = tiny_model(images, captions, idx)
    # The same caption fed for image 1 alone gives the same logits as inside the batch.
    alone = tiny_model(images[1:2], captions[2:3], torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(alone.logits[0], out.logits[2], atol=1e-5, rtol=1e-5)


def test_every_parameter_gets_a_gradient(tiny_model):
    images, captions, idx = _batch()
    out = tiny_model(images, captions, idx)
    caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total.backward()
    missing = [n for n, p in tiny_model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not missing, missing


def test_masked_regions_get_zero_weight():
    torch.manual_seed(0)
    att = SoftAttention(annotation_dim=6, hidden_dim=5, attention_dim=4)
    a, h = torch.randn(2, 9, 6), torch.randn(2, 5)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 4:] = False  # image 0 has a smaller grid
    out = att(a, att.prepare(a), h, mask)
    assert (out.alpha[0, 4:] == 0).all()
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(2))
    torch.testing.assert_close(out.context[0], out.alpha[0, :4] @ a[0, :4])


def test_state_init_uses_the_mean_annotation(tiny_model):
    dec = tiny_model.decoder
    a = torch.randn(2, 10, 16)
    h, c, alpha0 = dec.init_state(a)
    torch.testing.assert_close(h, torch.tanh(dec.init_h(a.mean(1))))
    torch.testing.assert_close(c, torch.tanh(dec.init_c(a.mean(1))))
    torch.testing.assert_close(alpha0, torch.full((2, 10), 0.1))
