"""The Python API (captioning.load): the same preprocessing and captions as evaluation, results that hold what
they say (maps per word that sum to 1, alternatives led by the caption), and clear errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from fixtures import compose_tiny_train
from PIL import Image

import captioning
from captioning.data.images import ImageError, load_image
from captioning.data.readers.karpathy import read_karpathy
from captioning.factory.datasets import build_datasets


@pytest.fixture(scope="module")
def checkpoint(trained_run):
    return trained_run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def test_paths(shapes_json):
    return [r.path for r in read_karpathy(shapes_json, "test")]


@pytest.mark.integration
def test_import_captioning_does_not_import_torch():
    code = "import sys, captioning; assert 'torch' not in sys.modules; print(captioning.load.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "captioning.inference.model"


def test_same_preprocessing_and_captions_as_the_data_sets(checkpoint, shapes_json, test_paths):
    model = captioning.load(checkpoint, device="cpu")
    cfg = compose_tiny_train(shapes_json).dataset
    _, data = build_datasets(cfg, model.model.encoder.transform(), splits=["test"], vocab=model.vocab)
    test = data["test"]
    images = torch.stack([test[i]["image"] for i in range(len(test))])
    for i, path in enumerate(test_paths):  # the tensor the API builds is the data set's, bit for bit
        assert torch.equal(model.transform(load_image(path)), images[i])
    decoded, _ = model.model.generate(images, beam_size=3, max_len=20)
    results = model.caption(test_paths, beam_size=3, batch_size=5)
    assert [r.words for r in results] == [model.vocab.decode(t) for t in decoded.tokens]
    assert len({r.caption for r in results}) > 1  # the captions are not all the same
    np.testing.assert_allclose([r.log_prob for r in results], decoded.scores.numpy(), atol=1e-5)


def test_a_result_holds_its_maps_image_and_alternatives(checkpoint, test_paths, tmp_path):
    model = captioning.load(checkpoint, device="cpu")
    single = model.caption(test_paths[0], alternatives=3)
    assert isinstance(single, captioning.CaptionResult) and single.source == str(test_paths[0])
    T = len(single.words)
    assert T > 0 and single.attention.shape == (T, 8, 8) and single.attention.dtype == np.float32
    np.testing.assert_allclose(single.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)
    assert single.image.size == (32, 32) and single.heatmap(0).shape == (32, 32)
    assert 1 <= len(single.alternatives) <= 3
    assert single.alternatives[0].words == tuple(single.words)
    assert single.alternatives[0].log_prob == pytest.approx(single.log_prob)
    assert len({a.caption for a in single.alternatives}) == len(single.alternatives)
    assert single.to_dict()["alternatives"][0]["caption"] == single.caption
    # a PIL image, a list, and batches of any size give the same captions
    pil = model.caption(Image.open(test_paths[0]))
    assert pil.source == "<image 0>" and pil.words == model.caption(test_paths[0]).words
    one_by_one = model.caption(test_paths, batch_size=1)
    assert [r.words for r in one_by_one] == [r.words for r in model.caption(test_paths, batch_size=16)]
    assert [r.source for r in one_by_one] == [str(p) for p in test_paths]
    # the figure: a matplotlib Figure, or a PNG file
    assert len(model.plot(single).axes) == T + 1
    png = model.plot(single, tmp_path / "fig.png")
    assert Image.open(png).size[0] > 100


def test_channel_wise_attention_gives_each_words_channel_weights(shapes_json, test_paths, tmp_path, checkpoint):
    from captioning.train import train

    train(compose_tiny_train(shapes_json, "attention=channel", "trainer.max_epochs=1", "eval.num_figures=0",
                             "eval.report=false"), tmp_path)
    model = captioning.load(tmp_path / "checkpoints" / "best.pt", device="cpu")
    result = model.caption(test_paths[0])
    T, D = len(result.words), model.model.encoder.out_dim
    assert result.channels is not None and result.channels.shape == (T, D) and result.channels.dtype == np.float32
    np.testing.assert_allclose(result.channels.sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(result.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)  # the spatial maps stay maps
    assert captioning.load(checkpoint, device="cpu").caption(test_paths[0]).channels is None  # soft attention


def test_the_adaptive_model_gives_each_words_sentinel_weight(shapes_json, test_paths, tmp_path):
    from captioning.train import train

    train(compose_tiny_train(shapes_json, "decoder=adaptive", "trainer.max_epochs=10", "eval.num_figures=0"), tmp_path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")  # each word's weight beside it on the report
    assert page.count('<sub class="beta"') == sum(len(r["caption"].split()) for r in
                                                  json.loads((tmp_path / "results.json").read_text()))
    model = captioning.load(tmp_path / "checkpoints" / "best.pt", device="cpu")
    result = next(r for r in model.caption(test_paths) if r.words)
    T = len(result.words)
    assert result.channels is None and result.sentinel is not None
    assert result.sentinel.shape == (T,) and result.sentinel.dtype == np.float32
    assert ((result.sentinel > 0) & (result.sentinel < 1)).all()
    np.testing.assert_allclose(result.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)  # the spatial maps stay maps
    assert result.to_dict()["sentinel"] == [round(float(b), 4) for b in result.sentinel]
    titles = [ax.get_title() for ax in model.plot(result).axes[1:]]
    assert titles == [f"{w}  \u03b2={b:.2f}" for w, b in zip(result.words, result.sentinel)]


def test_images_of_different_sizes_batch_and_bad_input_is_named(checkpoint, tmp_path, test_paths):
    model = captioning.load(checkpoint, device="cpu")
    Image.new("RGB", (48, 40), "red").save(tmp_path / "wide.png")
    mixed = model.caption([test_paths[0], tmp_path / "wide.png", test_paths[1]], batch_size=3)
    assert mixed[1].image.size == (48, 40) and mixed[1].attention.shape[1:] == (10, 12)
    assert [r.words for r in mixed[::2]] == [r.words for r in model.caption(test_paths[:2])]
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(ImageError, match="bad.png"):
        model.caption([test_paths[0], tmp_path / "bad.png"])
    with pytest.raises(ValueError, match="batch_size"):
        model.caption(test_paths, batch_size=0)
    with pytest.raises(ValueError, match="alternatives"):
        model.caption(test_paths[0], alternatives=-1)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        captioning.load(tmp_path / "nope.pt")


def test_a_pil_image_gets_the_loaders_colour_rules(checkpoint, tmp_path):
    model = captioning.load(checkpoint, device="cpu")
    rgba = Image.new("RGBA", (32, 32), (0, 0, 255, 0))  # fully transparent: white, as the loader shows it
    rgba.paste((255, 0, 0, 255), (8, 8, 20, 20))
    rgba.save(tmp_path / "rgba.png")
    from_file, from_pil = model.caption(tmp_path / "rgba.png"), model.caption(rgba)
    assert from_pil.words == from_file.words
    np.testing.assert_array_equal(np.asarray(from_pil.image), np.asarray(from_file.image))
    assert from_pil.image.getpixel((0, 0)) == (255, 255, 255)
