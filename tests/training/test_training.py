"""Training: a tiny model overfits one batch; checkpoints round-trip; the Hydra app runs end to end."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL, compose_config, compose_tiny_train

from captioning.checkpoint import read_checkpoint, save_checkpoint
from captioning.data.dataset import CaptionDataset, collate
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.factory.load import load_model
from captioning.factory.models import build_captioner
from captioning.metrics import attention_correctness
from captioning.models.decoding import greedy_decode
from captioning.train import train
from captioning.training.losses import caption_loss


def _one_batch(shapes_json, n_images=4):
    records = read_karpathy(shapes_json, "train")[:n_images]
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    model = build_captioner(TINY_MODEL, len(vocab))
    ds = CaptionDataset(records, vocab, model.encoder.transform())
    return model, vocab, collate([ds[i] for i in range(n_images)])


def test_tiny_model_overfits_one_batch(shapes_json):
    torch.manual_seed(0)
    model, vocab, batch = _one_batch(shapes_json)
    # One caption per image, so the target for each image is unambiguous.
    first = torch.tensor([(batch.image_index == i).nonzero()[0, 0].item() for i in range(4)])
    caps, idx = batch.captions[first], batch.image_index[first]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        out = model(batch.images, caps, idx)
        loss = caption_loss(out.logits, caps[:, 1:], out.alphas, vocab.pad_id, attention_weight=0.0)
        opt.zero_grad()
        loss.total.backward()
        opt.step()
    assert loss.token_nll.item() < 0.05
    model.eval()
    a, _ = model.encode(batch.images)
    decoded = greedy_decode(model.decoder, a, max_len=20)
    for i in range(4):
        target = [t for t in caps[i, 1:].tolist() if t not in (vocab.pad_id, vocab.end_id)]
        assert decoded.tokens[i] == target


def test_checkpoint_round_trip_gives_identical_captions(shapes_json, tmp_path):
    model, vocab, batch = _one_batch(shapes_json)
    model.eval()
    config = {"model": TINY_MODEL}
    path = save_checkpoint(tmp_path / "ckpt.pt", model, vocab, config, epoch=3)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically
    loaded, vocab2, ckpt = load_model(path)
    assert vocab2 == vocab and ckpt["epoch"] == 3
    a1, _ = model.encode(batch.images)
    a2, _ = loaded.encode(batch.images)
    assert greedy_decode(model.decoder, a1, 10).tokens == greedy_decode(loaded.decoder, a2, 10).tokens


def test_foreign_or_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "nope.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a captioning checkpoint"):
        read_checkpoint(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not a readable captioning checkpoint"):
        read_checkpoint(tmp_path / "junk.pt")


@pytest.mark.integration  # three epochs end to end: trained, then resumed
def test_train_app_end_to_end_and_resume(shapes_json, tmp_path):
    cfg = compose_tiny_train(shapes_json, "trainer.max_epochs=2")
    metrics = train(cfg, tmp_path)
    for name in ("metrics.json", "results.json", "history.json", "checkpoints/best.pt", "checkpoints/last.pt"):
        assert (tmp_path / name).is_file(), name
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["epochs"] == 2 and saved["num_images"] == 12 and saved["beam_size"] == 3
    assert 0 <= saved["Bleu_4"] <= 1 and "CIDEr" in saved and "attention_correctness" in saved
    assert len(json.loads((tmp_path / "results.json").read_text())) == 12
    per_image = json.loads((tmp_path / "per_image_scores.json").read_text())
    assert len(per_image) == 12 and {"caption", "references", "Bleu_4", "CIDEr"} <= set(per_image[0])
    worst = json.loads((tmp_path / "worst_by_cider.json").read_text())
    assert [w["CIDEr"] for w in worst] == sorted(p["CIDEr"] for p in per_image)[: len(worst)]
    assert len(list((tmp_path / "figures").glob("*.png"))) >= 1
    assert metrics["CIDEr"] == saved["CIDEr"]
    # Resume the same run for one more epoch: it continues from epoch 2, not from scratch.
    cfg3 = compose_tiny_train(shapes_json, "trainer.max_epochs=3", "resume=auto")
    train(cfg3, tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["epochs"] == 3
    assert [h["epoch"] for h in json.loads((tmp_path / "history.json").read_text())] == [1, 2, 3]
    # A checkpoint of another model is refused with a clear message.
    other = compose_tiny_train(shapes_json, "decoder.hidden_dim=24", f"resume={tmp_path / 'checkpoints/last.pt'}")
    with pytest.raises(ValueError, match="different model config"):
        train(other, tmp_path / "other")


# Each attention's own overrides; one epoch unless said (the tiny multi-level model's first two epochs end every
# caption at once: no word, so no figure to check).
OTHER_ATTENTION = {"hard": ["attention.expected_context_prob=0.0"], "location": [], "multihead": [], "mean": [],
                   "monotonic": [], "local-m": ["attention.centre=monotonic"], "channel": [],
                   "multilevel": ["trainer.max_epochs=3"]}


@pytest.mark.parametrize("attention", sorted(OTHER_ATTENTION))
def test_train_app_with_other_attention(shapes_json, tmp_path, attention):
    epochs = [] if any(o.startswith("trainer.max_epochs=") for o in OTHER_ATTENTION[attention]) else \
        ["trainer.max_epochs=1"]
    cfg = compose_tiny_train(shapes_json, f"attention={attention.split('-')[0]}", *epochs,
                             "objective.num_samples=2", *OTHER_ATTENTION[attention])
    metrics = train(cfg, tmp_path)
    assert metrics["attention"] == cfg.attention._target_.rsplit(".", 1)[-1]  # outside a Hydra app: the class
    history = json.loads((tmp_path / "history.json").read_text())
    if attention == "hard":  # every batch sampled regions: the REINFORCE terms were logged
        assert "policy" in history[0] and "entropy" in history[0] and history[0]["baseline"] < 0
    assert len(list((tmp_path / "figures").glob("*.png"))) >= 1


def test_the_no_attention_control_scores_the_uniform_baseline(shapes_json, tmp_path):
    """attention=mean: every stored map is uniform, and attention correctness is uniform maps' on its own words."""
    metrics = train(compose_tiny_train(shapes_json, "attention=mean", "trainer.max_epochs=2"), tmp_path)
    images = {i["imgid"]: i for i in json.loads(shapes_json.read_text())["images"] if i["split"] == "test"}
    captions = {r["image_id"]: r["caption"].split() for r in json.loads((tmp_path / "results.json").read_text())}
    stored = np.load(tmp_path / "attention.npz")
    grid = stored[f"alphas_{next(iter(captions))}"].shape[1:]
    for image_id in captions:
        maps = stored[f"alphas_{image_id}"].astype(np.float64)
        np.testing.assert_allclose(maps, 1 / (grid[0] * grid[1]), rtol=1e-3)  # float16 in the file
    ids = sorted(captions)
    uniform = attention_correctness([captions[i] for i in ids],
                                    [np.full((len(captions[i]), *grid), 1 / (grid[0] * grid[1])) for i in ids],
                                    [images[i]["word_boxes"] for i in ids],
                                    [(images[i]["height"], images[i]["width"]) for i in ids])
    assert uniform["attention_words"] == metrics["attention_words"] > 0
    assert metrics["attention_correctness"] == pytest.approx(uniform["attention_correctness"], abs=1e-6)


def test_evaluate_app_rescoring_a_checkpoint(shapes_json, tmp_path):
    from captioning.evaluate import evaluate

    train(compose_tiny_train(shapes_json, "trainer.max_epochs=1"), tmp_path / "run")
    trained = json.loads((tmp_path / "run" / "metrics.json").read_text())
    cfg = compose_config(f"checkpoint={tmp_path / 'run/checkpoints/best.pt'}", "eval.metrics=[bleu,cider]",
                         "eval.num_figures=1", name="evaluate")
    metrics = evaluate(cfg, tmp_path / "eval")
    # Same checkpoint, same split, same beam: the same scores as the end of training.
    # metrics.json stores an undefined score (NaN: no caption word names an object) as null.
    for key in ("Bleu_4", "CIDEr", "attention_correctness"):
        expected = float("nan") if trained[key] is None else trained[key]
        assert metrics[key] == pytest.approx(expected, abs=1e-12, nan_ok=True)
    assert (tmp_path / "eval" / "results.json").is_file() and (tmp_path / "eval" / "figures").is_dir()


def test_training_skips_and_counts_unreadable_images(shapes_json, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(Path(shapes_json).parent, data)
    (data / "images" / "train_00003.png").write_bytes(b"")  # a 0-byte file
    (data / "images" / "test_00001.png").unlink()  # a missing file
    cfg = compose_tiny_train(data / "dataset_shapes.json", "trainer.max_epochs=1")
    metrics = train(cfg, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "history.json").read_text())[0]["skipped_images"] == 1
    assert metrics["skipped_images"] == 1 and metrics["num_images"] == 11


def test_unknown_monitor_is_refused_before_training(shapes_json, tmp_path):
    with pytest.raises(ValueError, match="trainer.monitor='METEOR' is not computed during validation"):
        train(compose_tiny_train(shapes_json, "trainer.monitor=METEOR"), tmp_path)
