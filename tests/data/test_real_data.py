"""Real data formats end to end: Karpathy JSON and raw COCO captions with JPEG/PNG files written here;
training, the feature cache (same captions as on-the-fly encoding), evaluation, and the paper presets offline."""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from fixtures import compose_config
from PIL import Image

from captioning.base.lock import LOCK_NAME, FolderLock
from captioning.data.dataset import CaptionDataset, collate
from captioning.data.images import load_image
from captioning.data.readers.coco_captions import read_coco_captions
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluate import evaluate
from captioning.evaluation.split import decode_split
from captioning.factory.datasets import load_records
from captioning.factory.load import load_model
from captioning.factory.models import build_captioner, build_encoder, model_config
from captioning.features.cache import FeatureCache
from captioning.models.encoder import ResNetEncoder
from captioning.runtime import set_seed
from captioning.tools.extract_features import extract
from captioning.train import train

COLOURS = {"red": (220, 40, 30), "green": (40, 190, 60), "blue": (30, 60, 210)}
TRAIN_IDS, VAL_IDS = list(range(1, 9)), [101, 102, 103, 104]


def _image(path: Path, k: int) -> str:
    """Write image k (JPEG or PNG, varying size, a coloured square on grey); returns its colour word."""
    colour = list(COLOURS)[k % 3]
    im = Image.new("RGB", (48 + 4 * k, 40), (128, 128, 128))
    im.paste(COLOURS[colour], (8 + k, 8, 28 + k, 28))
    im.save(path, quality=90)
    return colour


def _captions(colour: str) -> list[str]:
    return [f"A {colour} square on grey.", f"The square is {colour}!", "   "]  # the last one is empty


def make_dataset(root: Path, fmt: str) -> list[str]:
    """12 images with captions in the given format (karpathy | coco); returns the Hydra overrides that use it."""
    root.mkdir(parents=True, exist_ok=True)
    if fmt == "karpathy":
        (root / "images").mkdir()
        entries = []
        for k, image_id in enumerate(TRAIN_IDS + VAL_IDS):
            name = f"img_{image_id}.{'jpg' if k % 2 else 'png'}"
            colour = _image(root / "images" / name, k)
            split = "train" if image_id in TRAIN_IDS else ("val" if image_id < 103 else "test")
            entries.append({"filename": name, "imgid": image_id, "split": split,
                            "sentences": [{"raw": c, "tokens": []} for c in _captions(colour)]})
        (root / "dataset_flickr8k.json").write_text(json.dumps({"images": entries}))
        return ["dataset=flickr8k", f"dataset.annotations={root / 'dataset_flickr8k.json'}",
                f"dataset.image_root={root / 'images'}"]
    for folder, ids, offset in (("train2014", TRAIN_IDS, 0), ("val2014", VAL_IDS, len(TRAIN_IDS))):
        (root / folder).mkdir()
        images, anns = [], []
        for k, image_id in enumerate(ids, start=offset):
            name = f"COCO_{folder}_{image_id:012d}.{'jpg' if k % 2 else 'png'}"
            colour = _image(root / folder / name, k)
            images.append({"id": image_id, "file_name": name, "height": 40, "width": 48 + 4 * k})
            anns += [{"id": 10 * image_id + j, "image_id": image_id, "caption": c} for j, c in enumerate(_captions(colour))]
        (root / f"captions_{folder}.json").write_text(json.dumps({"images": images, "annotations": anns}))
    return ["dataset=coco", "dataset/reader=coco", f"dataset.image_root={root}",
            f"dataset.reader.train_captions={root / 'captions_train2014.json'}",
            f"dataset.reader.val_captions={root / 'captions_val2014.json'}", "dataset.reader.num_val=2",
            "dataset.reader.num_test=2"]


# A frozen, randomly initialised ResNet-18 at 64 px (2 x 2 x 512 grid) and a tiny decoder: seconds on a CPU.
TINY = ["encoder=resnet50", "encoder.arch=resnet18", "encoder.pretrained=false", "encoder.fine_tune=none",
        "encoder.image_size=64", "encoder.grid_size=2", "decoder.embed_dim=16", "decoder.hidden_dim=32",
        "attention.attention_dim=16", "dataset.min_word_freq=1", "dataset.batch_size=4", "dataset.num_workers=0",
        "trainer.max_epochs=1", "trainer.progress=false", "eval.metrics=[bleu,cider]", "eval.num_figures=1"]


def test_both_formats_read_the_same_records(tmp_path):
    make_dataset(tmp_path / "k", "karpathy")
    make_dataset(tmp_path / "c", "coco")
    for split, ids in (("train", TRAIN_IDS), ("val", [101, 102]), ("test", [103, 104])):
        kar = read_karpathy(tmp_path / "k" / "dataset_flickr8k.json", split, tmp_path / "k" / "images")
        coco = read_coco_captions(tmp_path / "c" / "captions_train2014.json", tmp_path / "c" / "captions_val2014.json",
                                  [split], tmp_path / "c", num_val=2, num_test=2)[split]
        assert [r.image_id for r in kar] == [r.image_id for r in coco] == ids
        assert [r.captions for r in kar] == [r.captions for r in coco]  # tokenised by the same tokenizer
    first = read_coco_captions(tmp_path / "c" / "captions_train2014.json", tmp_path / "c" / "captions_val2014.json",
                               ["train"], tmp_path / "c")["train"][0]
    assert first.captions == [["a", "red", "square", "on", "grey"], ["the", "square", "is", "red"]]
    assert first.raw == ["A red square on grey.", "The square is red!"]  # the empty caption was skipped
    assert first.path == tmp_path / "c" / "train2014" / "COCO_train2014_000000000001.png" and first.size == (40, 48)


def test_coco_split_rule_and_karpathy_split_file(tmp_path):
    make_dataset(tmp_path, "coco")
    files = (tmp_path / "captions_train2014.json", tmp_path / "captions_val2014.json")
    by_rule = read_coco_captions(*files, ["train", "val", "test"], tmp_path, num_val=1, num_test=2)
    ids = {s: [r.image_id for r in rs] for s, rs in by_rule.items()}
    assert ids == {"train": TRAIN_IDS + [104], "val": [101], "test": [102, 103]}  # the rest of val2014 trains
    assert by_rule["train"][-1].path.parent == tmp_path / "val2014"
    karpathy = {"images": [{"cocoid": 1, "split": "test"}, {"cocoid": 2, "split": "restval"}, {"cocoid": 101, "split": "val"},
                           {"cocoid": 102, "split": "train"}]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(karpathy))
    by_file = read_coco_captions(*files, ["train", "val", "test"], tmp_path, split_file=tmp_path / "dataset_coco.json")
    assert {s: [r.image_id for r in rs] for s, rs in by_file.items()} == {"train": [2, 102], "val": [101], "test": [1]}
    with pytest.raises(ValueError, match="split 'val' has no images"):
        read_coco_captions(*files, ["val"], tmp_path, num_val=0)


def test_captioner_takes_precomputed_annotations():
    model = build_captioner(model_config(compose_config(*TINY)), vocab_size=10).eval()
    images = torch.rand(2, 3, 64, 64)
    a, grid = model.encode(images)  # (2, 4, 512) from the encoder
    b, grid_b = model.encode(a)  # passed through
    assert b is a and grid == grid_b == (2, 2)
    caps = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]])
    torch.testing.assert_close(model(images, caps).logits, model(a, caps).logits)
    with pytest.raises(ValueError, match=r"square grid .* D = 512 .* got \(2, 3, 512\)"):
        model.encode(torch.rand(2, 3, 512))
    with pytest.raises(ValueError, match=r"got \(2, 4, 64\)"):
        model.encode(torch.rand(2, 4, 64))


def _decode_both_ways(model, records, vocab, cache):
    on_the_fly = CaptionDataset(records, vocab, model.encoder.transform())
    cached = CaptionDataset(records, vocab, model.encoder.transform(), features=cache)
    a = decode_split(model, on_the_fly, beam_size=3, max_len=12, progress=False)
    b = decode_split(model, cached, beam_size=3, max_len=12, progress=False)
    return a, b


@pytest.mark.parametrize("fmt", ["karpathy", "coco"])
def test_train_from_cache_evaluate_and_cache_matches_on_the_fly(tmp_path, fmt):
    data = make_dataset(tmp_path / "data", fmt)
    feats = f"dataset.features={tmp_path / 'features'}"
    cache = extract(compose_config(*data, *TINY, feats, name="extract_features"))
    assert len(cache) == 12 and cache.grid == (2, 2) and cache.grids.dtype == np.float16
    assert cache.grids.shape == (12, 4, 512)  # (N, L, D)
    cached = train(compose_config(*data, *TINY, feats), tmp_path / "cached")
    assert cached["num_images"] == 2 and cached["skipped_images"] == 0
    if fmt == "karpathy":  # the reader does not matter here: once is enough
        direct = train(compose_config(*data, *TINY), tmp_path / "direct")
        # Same seed, same frozen encoder: an epoch from the cache trains like one from the images (up to float16).
        h_cached, h_direct = (json.loads((tmp_path / r / "history.json").read_text())[0] for r in ("cached", "direct"))
        assert h_cached["loss"] == pytest.approx(h_direct["loss"], rel=1e-3)
        assert cached["Bleu_4"] == pytest.approx(direct["Bleu_4"], abs=1e-6)

    ckpt_path = tmp_path / "cached" / "checkpoints" / "best.pt"
    ev = evaluate(compose_config(f"checkpoint={ckpt_path}", "eval.metrics=[bleu,cider]", "eval.num_figures=0",
                                 name="evaluate"), tmp_path / "eval")
    assert ev["num_images"] == 2 and ev["CIDEr"] == pytest.approx(cached["CIDEr"], abs=1e-12)
    if fmt == "karpathy":  # once cached, the images are not needed: without them evaluation still writes its files
        (tmp_path / "data" / "images").rename(tmp_path / "data" / "images_gone")
        ev2 = evaluate(compose_config(f"checkpoint={ckpt_path}", "eval.metrics=[bleu,cider]", "eval.num_figures=2",
                                      name="evaluate"), tmp_path / "eval2")
        assert ev2["CIDEr"] == ev["CIDEr"] and (tmp_path / "eval2" / "report.html").is_file()
        assert not (tmp_path / "eval2" / "figures").exists()  # no figures without images, and no crash
        evaluate(compose_config(f"checkpoint={ckpt_path}", "eval.metrics=[bleu]", "eval.report=false", name="evaluate"),
                 tmp_path / "eval3")
        assert (tmp_path / "eval3" / "metrics.json").is_file() and not (tmp_path / "eval3" / "report.html").exists()
        (tmp_path / "data" / "images_gone").rename(tmp_path / "data" / "images")

    model, vocab, ckpt = load_model(ckpt_path)
    records = [r for rs in load_records(compose_config(*data).dataset, ["train", "val", "test"]).values() for r in rs]
    cache = FeatureCache.open(tmp_path / "features", model.encoder, ckpt["config"]["model"]["encoder"])
    transform = model.encoder.transform()
    with torch.no_grad():
        for r in records:
            a, _ = model.encode(transform(load_image(r.path)).unsqueeze(0))  # (1, L, D)
            torch.testing.assert_close(cache[r.image_id], a[0], rtol=1e-3, atol=1e-4)  # float16 rounding only
    a, b = _decode_both_ways(model, records, vocab, cache)
    assert [p.words for p in a] == [p.words for p in b] and any(p.words for p in a)
    for p, q in zip(a, b):
        torch.testing.assert_close(p.alphas, q.alphas, rtol=0, atol=1e-3)


def test_mismatched_or_incomplete_cache_is_refused(tmp_path):
    data = make_dataset(tmp_path / "data", "karpathy")
    feats = f"dataset.features={tmp_path / 'features'}"
    extract(compose_config(*data, *TINY, feats, name="extract_features"))
    with pytest.raises(ValueError, match="made by a different encoder") as err:  # through the training app
        train(compose_config(*data, *TINY, feats, "encoder.image_size=32"), tmp_path / "run")
    assert "encoder.image_size: cache 64, now 32" in str(err.value)
    assert "captioning-extract-features" in str(err.value)
    for override, detail in (("encoder.grid_size=1", "encoder.grid_size: cache 2, now 1"),
                             ("seed=1", "weights_sha256"),  # another random initialisation
                             ("encoder.arch=resnet34", "encoder.arch: cache 'resnet18', now 'resnet34'")):
        cfg = compose_config(*data, *TINY, feats, override)
        set_seed(cfg.seed)
        with pytest.raises(ValueError, match="made by a different encoder") as err:
            FeatureCache.open(tmp_path / "features", build_encoder(cfg.encoder), cfg.encoder)
        assert detail in str(err.value)
    with pytest.raises(ValueError, match="needs a frozen encoder"):
        train(compose_config(*data, *TINY, feats, "encoder.fine_tune=top"), tmp_path / "run")
    # Extracting into a cache of another encoder is refused; overwrite=true replaces it.
    with pytest.raises(ValueError, match="already holds a feature cache made differently"):
        extract(compose_config(*data, *TINY, feats, "encoder.image_size=32", name="extract_features"))
    replaced = extract(compose_config(*data, *TINY, feats, "encoder.image_size=32", "overwrite=true",
                                      name="extract_features"))
    assert replaced.meta["fingerprint"]["encoder"]["image_size"] == 32
    # A cache of the train split only cannot serve the test split.
    only_train = tmp_path / "train_only"
    extract(compose_config(*data, *TINY, f"dataset.features={only_train}", "splits=[train]", name="extract_features"))
    with pytest.raises(ValueError, match=r"2 of 2 images are not in the feature cache .*train_only"):
        train(compose_config(*data, *TINY, f"dataset.features={only_train}"), tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="no feature cache at"):
        FeatureCache.open(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="set dataset.features=PATH"):
        extract(compose_config(*data, *TINY, name="extract_features"))


def test_a_second_extraction_into_a_cache_in_use_waits_for_it(tmp_path, caplog):
    data = make_dataset(tmp_path / "data", "karpathy")
    cfg = compose_config(*data, *TINY, f"dataset.features={tmp_path / 'features'}", name="extract_features")
    done: list[int] = []
    with caplog.at_level(logging.INFO, logger="captioning.base.lock"):
        with FolderLock(tmp_path / "features", "feature extraction"):  # another extraction holds the folder
            second = threading.Thread(target=lambda: done.append(len(extract(cfg))))
            second.start()
            second.join(timeout=1.0)
            assert second.is_alive() and not done  # it waits ...
            assert [p.name for p in (tmp_path / "features").iterdir()] == [LOCK_NAME]  # ... and has written nothing
        second.join(timeout=120)
    assert done == [12]  # then fills the cache: its own lock file does not make the folder "not a feature cache"
    assert [r.getMessage() for r in caplog.records if r.name == "captioning.base.lock"] == [
        f"waiting for PID {os.getpid()}'s feature extraction in {tmp_path / 'features'} to end"]


def test_interrupted_extraction_resumes_where_it_stopped(tmp_path, monkeypatch):
    data = make_dataset(tmp_path / "data", "karpathy")
    reference = extract(compose_config(*data, *TINY, f"dataset.features={tmp_path / 'full'}", name="extract_features"))
    cfg = compose_config(*data, *TINY, f"dataset.features={tmp_path / 'features'}", "batch_size=5",
                         name="extract_features")
    forward, seen = ResNetEncoder.forward, []

    def interrupted_after_two_batches(self, images):
        if len(images) == 1:
            return forward(self, images)  # the grid-size probe on a blank image, before any image is read
        if len(seen) == 2:
            raise KeyboardInterrupt  # what Ctrl-C or a killed job leaves behind
        seen.append(len(images))
        return forward(self, images)

    monkeypatch.setattr(ResNetEncoder, "forward", interrupted_after_two_batches)
    with pytest.raises(KeyboardInterrupt):
        extract(cfg)
    assert json.loads((tmp_path / "features" / "progress.json").read_text())["rows_done"] == 10
    with pytest.raises(ValueError, match=r"unfinished \(10 of 12 images\)"):
        FeatureCache.open(tmp_path / "features")
    seen.clear()
    monkeypatch.setattr(ResNetEncoder, "forward", lambda self, images: seen.append(len(images)) or forward(self, images))
    cache = extract(cfg)
    assert seen == [2]  # only the two images that were left
    np.testing.assert_array_equal(np.asarray(cache.grids), np.asarray(reference.grids))


def test_unreadable_image_is_recorded_in_the_cache_and_counted(tmp_path):
    data = make_dataset(tmp_path / "data", "karpathy")
    (tmp_path / "data" / "images" / "img_2.jpg").write_bytes(b"")  # 0-byte file in the train split
    cache = extract(compose_config(*data, *TINY, f"dataset.features={tmp_path / 'features'}", name="extract_features"))
    assert list(cache.failed) == ["2"] and "img_2.jpg" in cache.failed["2"]
    metrics = train(compose_config(*data, *TINY, f"dataset.features={tmp_path / 'features'}"), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "history.json").read_text())[0]["skipped_images"] == 1
    assert metrics["skipped_images"] == 0 and metrics["num_images"] == 2
    records = read_karpathy(tmp_path / "data" / "dataset_flickr8k.json", "train", tmp_path / "data" / "images")
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    ds = CaptionDataset(records[:3], vocab, lambda im: im, features=cache)
    batch = collate([ds[i] for i in range(3)])
    assert batch.images.shape == (2, 4, 512) and len(batch.skipped) == 1 and "img_2.jpg" in batch.skipped[0]


def _offline(monkeypatch):
    """Make every weight download fail as it does without network (whatever is in the local torch cache)."""
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", no_network)


@pytest.mark.parametrize("config", ["train", "extract_features"])
def test_offline_paper_preset_fails_fast_with_instructions(tmp_path, monkeypatch, config):
    _offline(monkeypatch)
    data = make_dataset(tmp_path / "data", "karpathy")

    def never(*args, **kwargs):
        raise AssertionError("data was read before the encoder's weights were checked")

    # what the trainer and the extraction read data with (both import it when their work starts)
    monkeypatch.setattr("captioning.factory.datasets.load_records", never)
    out = [f"dataset.features={tmp_path / 'features'}"] if config == "extract_features" else []
    cfg = compose_config("experiment=flickr8k_soft", *data[1:], *out, name=config)
    with pytest.raises(OSError, match=r"cannot download the vgg19 weights.*encoder.weights=/path/to/vgg19-.*\.pth.*"
                                      r"hub/checkpoints.*encoder\.pretrained=false"):
        train(cfg, tmp_path / "run") if config == "train" else extract(cfg)
    assert not (tmp_path / "features").exists()


def _preset_on_test_data(tmp_path, *overrides: str) -> dict:
    data = make_dataset(tmp_path / "data", "karpathy")
    cfg = compose_config("experiment=flickr8k_soft", *data[1:], "encoder.pretrained=false", "dataset.min_word_freq=1",
                   "dataset.batch_size=4", "dataset.num_workers=0", "trainer.max_epochs=1", "trainer.progress=false",
                   "eval.metrics=[bleu,cider]", "eval.num_figures=0", "eval.beam_size=2", *overrides)
    assert cfg.encoder.arch == "vgg19" and cfg.optim._target_ == "torch.optim.RMSprop"
    return train(cfg, tmp_path / "run")


def test_paper_preset_runs_without_pretrained_weights_small(tmp_path):
    # The flickr8k_soft preset (VGG-19, RMSprop, dropout 0.5, lambda 1, BLEU-4 early stopping) at 32 px with a
    # small decoder: conv5_4 gives a 2 x 2 x 512 grid.
    metrics = _preset_on_test_data(tmp_path, "encoder.image_size=32", "decoder.embed_dim=32", "decoder.hidden_dim=64",
                                   "attention.attention_dim=32")
    assert metrics["epochs"] == 1 and metrics["num_images"] == 2 and "val_Bleu_4" in metrics


@pytest.mark.slow
def test_paper_preset_runs_without_pretrained_weights_full_size(tmp_path):
    # The preset unchanged but for the weights and budgets: 224 px, 14 x 14 x 512, LSTM 1800.
    metrics = _preset_on_test_data(tmp_path)
    assert metrics["epochs"] == 1 and metrics["num_images"] == 2
