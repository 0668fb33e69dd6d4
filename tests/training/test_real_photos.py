"""Real photographs with real ImageNet weights: a few of the shared Flickr8k photos (read from ../shared/flickr8k-1k,
never copied into the project) captioned by a model over a frozen MobileNetV2, from its weights file: features
extracted once by the run, one epoch, the test with an empty caption among the results, and its report."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from fixtures import FLICKR8K_1K, MOBILENET_V2_FILE, compose_config, needs_flickr8k_1k, needs_offline_weights

pytestmark = [needs_flickr8k_1k, needs_offline_weights]
PER_SPLIT = {"train": 16, "val": 4, "test": 4}


def small_table(folder: Path) -> tuple[Path, Path]:
    """The first photos of each split of the shared set, as a caption table and a split file of their own (the
    photos stay where they are: image_root is the shared folder)."""
    with open(FLICKR8K_1K / "split.csv", newline="") as f:
        split_of = {row["image"]: row["split"] for row in csv.DictReader(f)}
    chosen = {s: [i for i, t in split_of.items() if t == s][:n] for s, n in PER_SPLIT.items()}
    keep = {i for images in chosen.values() for i in images} | {next(i for i, t in split_of.items()
                                                                   if t == "unassigned")}
    folder.mkdir(parents=True, exist_ok=True)
    with open(FLICKR8K_1K / "captions.csv", newline="") as f, open(folder / "captions.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["image", "caption"])
        writer.writerows([row["image"], row["caption"]] for row in csv.DictReader(f) if row["image"] in keep)
    with open(folder / "split.csv", "w", newline="") as out:
        csv.writer(out).writerows([["image", "split"], *([i, split_of[i]] for i in sorted(keep))])
    return folder / "captions.csv", folder / "split.csv"


def photo_config(tmp_path: Path, *overrides: str):
    table, splits = small_table(tmp_path / "table")
    return compose_config(
        "experiment=flickr8k_1k", f"dataset.root={FLICKR8K_1K}", f"dataset.annotations={table}",
        f"dataset.reader.split_file={splits}", f"dataset.features={tmp_path / 'features'}",
        f"data_dir={tmp_path / 'data'}", f"encoder.weights={MOBILENET_V2_FILE}", "dataset.min_word_freq=2",
        "decoder.embed_dim=32", "decoder.hidden_dim=64", "dataset.batch_size=8", "trainer.progress=false",
        "eval.metrics=[bleu,cider]", "eval.num_figures=2", *overrides)


def test_a_real_photo_run_trains_evaluates_an_empty_caption_and_writes_its_report(tmp_path, monkeypatch, caplog):
    from captioning.train import train
    from captioning.training import validation

    decode = validation.decode_whole

    def first_caption_empty(*args, **kwargs):
        preds = decode(*args, **kwargs)
        preds[0].words, preds[0].alphas = [], preds[0].alphas[:0]  # (0, h, w): what <end> first gives
        return preds

    monkeypatch.setattr(validation, "decode_whole", first_caption_empty)
    metrics = train(photo_config(tmp_path, "trainer.max_epochs=1"), tmp_path / "run")
    assert metrics["num_images"] == PER_SPLIT["test"] and metrics["skipped_images"] == 0
    assert 0 <= metrics["CIDEr"] and "Bleu_4" in metrics
    assert (tmp_path / "features" / "meta.json").is_file()  # extracted once, by the run
    meta = json.loads((tmp_path / "features" / "meta.json").read_text())
    assert meta["grid"] == [7, 7] and meta["weights"] == "mobilenet_v2 from the file mobilenet_v2-b0353104.pth"
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    assert len(results) == PER_SPLIT["test"] and results[0]["caption"] == ""
    assert (run / "report.html").is_file() and len(list((run / "figures").glob("*.png"))) == 2
    assert "skipped 1 images (5 captions) whose split is not train, val or test (unassigned)" in caplog.text
    # a second run reads the finished cache as it is
    caplog.clear()
    with caplog.at_level("INFO"):
        train(photo_config(tmp_path, "trainer.max_epochs=1"), tmp_path / "again")
    assert f"the feature cache {tmp_path / 'features'} holds all {sum(PER_SPLIT.values())} images" in caplog.text


@pytest.mark.parametrize("change", ["dataset.features", "dataset.num_workers"])
def test_captioning_evaluate_takes_keys_of_the_checkpoints_data_set(tmp_path, change):
    from captioning.evaluate import checkpoint_dataset_keys, evaluate
    from captioning.train import train

    train(photo_config(tmp_path, "trainer.max_epochs=1", "eval.report=false"), tmp_path / "run")
    value = {"dataset.features": "null", "dataset.num_workers": "0"}[change]
    args = checkpoint_dataset_keys([f"checkpoint={tmp_path / 'run/checkpoints/best.pt'}", f"{change}={value}",
                                    "eval.metrics=[bleu]", "eval.num_figures=0", "eval.report=false"])
    assert args[1] == f"+{change}={value}"
    metrics = evaluate(compose_config(*args, name="evaluate"), tmp_path / "eval")
    assert metrics["num_images"] == PER_SPLIT["test"]
    typo = checkpoint_dataset_keys([f"checkpoint={tmp_path / 'run/checkpoints/best.pt'}", "dataset.featurs=null"])
    with pytest.raises(ValueError, match=r"dataset.featurs is not a data set key: .*did you mean 'features'"):
        evaluate(compose_config(*typo, name="evaluate"), tmp_path / "eval2")


@pytest.fixture(scope="module")
def photo_checkpoint(tmp_path_factory) -> Path:
    """best.pt of a one-epoch run over the frozen MobileNetV2 (its features cached), trained on real photos."""
    from captioning.train import train

    tmp = tmp_path_factory.mktemp("photo_model")
    train(photo_config(tmp, "trainer.max_epochs=1", "eval.report=false", "eval.num_figures=0"), tmp / "run")
    return tmp / "run" / "checkpoints" / "best.pt"


def _test_photos(n: int = 2) -> list[Path]:
    with open(FLICKR8K_1K / "split.csv", newline="") as f:
        return [FLICKR8K_1K / "images" / row["image"] for row in csv.DictReader(f) if row["split"] == "test"][:n]


def test_a_mobilenet_model_captions_photos_through_the_api_the_command_and_the_demo(photo_checkpoint, capsys):
    import captioning
    from captioning.inference.demo_app import make_server
    from captioning.tools.caption import main as caption_main

    model = captioning.load(photo_checkpoint, device="cpu")
    photos = _test_photos()
    results = model.caption(photos)
    assert all(r.words and r.attention.shape == (len(r.words), 7, 7) for r in results)  # the 7 x 7 grid
    assert all("<unk>" not in r.words for r in results)
    capsys.readouterr()
    assert caption_main([*map(str, photos), "--checkpoint", str(photo_checkpoint), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert all(" ".join(r.words) in printed for r in results)
    server = make_server(model)
    try:
        answer = server.caption(photos[0].read_bytes(), photos[0].name)
    finally:
        server.server_close()
    assert answer["caption"] == " ".join(results[0].words)


def test_a_mobilenet_model_exports_and_the_torch_free_runner_gives_the_same_words(photo_checkpoint, tmp_path):
    pytest.importorskip("onnxruntime")
    import captioning
    from captioning.export.exporter import export_checkpoint
    from captioning.export.runner import Runner

    export_checkpoint(photo_checkpoint, tmp_path / "export", optimize=False)
    runner = Runner(tmp_path / "export")
    photos = _test_photos()
    for beam in (1, 3):
        want = captioning.load(photo_checkpoint, device="cpu").caption(photos, beam_size=beam)
        got = runner.caption(photos, beam_size=beam)
        assert [c.words for c in got] == [r.words for r in want]


def test_captioning_html_finds_the_photos_under_the_checkpoints_image_root(photo_checkpoint, tmp_path, capsys):
    """A Karpathy file written elsewhere (captioning-prepare --to-karpathy) names its images relative to the data
    set's image root: without --image-root the page finds them through --checkpoint, and says once when it cannot."""
    from captioning.checkpoint import read_checkpoint
    from captioning.data.readers.convert import write_karpathy
    from captioning.factory.datasets import load_records
    from captioning.tools.html import main as html_main

    dataset = read_checkpoint(photo_checkpoint)["config"]["dataset"]
    records = load_records(dataset, ["test"])
    annotations = write_karpathy(records, dataset["image_root"], tmp_path / "elsewhere" / "dataset_photos.json")
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": r.image_id, "caption": "a dog runs"} for r in records["test"]]))
    capsys.readouterr()
    assert html_main(["--results", str(results), "--annotations", str(annotations), "--metrics", "bleu",
                      "--out", str(tmp_path / "without.html")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and f"4 of 4 images are not found (e.g. {tmp_path / 'elsewhere'}" in err
    assert html_main(["--results", str(results), "--annotations", str(annotations), "--metrics", "bleu",
                      "--checkpoint", str(photo_checkpoint), "--out", str(tmp_path / "with.html")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert (tmp_path / "with.html").read_text().count("data:image/jpeg;base64,") >= 4  # the photos are in the page
