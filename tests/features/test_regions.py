"""Bottom-up region features (issue 46, item 1): the TSV converted into a region cache (exact, resumable, checked),
per-image npz folders read, and a tiny model trained, evaluated and refused export on both. The features are
generated: each `shapes` object is a region (its shape and colour one-hot, its box centre) beside random background
regions, so every image has its own number of regions."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import compose_tiny_train

from captioning.data.images import ImageError
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.shapes.captions import COLOURS, SHAPES
from captioning.features import regions_tsv
from captioning.features.disk import NotEnoughSpaceError
from captioning.features.regions import RegionCache, RegionError, RegionFolder, open_regions
from captioning.features.regions_tsv import convert_tsv
from captioning.tools.convert_regions import main as convert_main

DIM = 16  # 4 shapes + 4 colours + the box centre (2) + 6 of noise


def shapes_regions(records, seed: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray, tuple[int, int]]]:
    """image id -> (features (n, DIM), boxes (n, 4), (height, width)): one region per object, 1-3 background ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in records:
        h, w = r.size
        feats, boxes = [], []
        for k, shape in enumerate(SHAPES):
            for box in r.word_boxes.get(shape, []):
                colour = next((c for c in COLOURS if list(box) in [list(b) for b in r.word_boxes.get(c, [])]), None)
                f = rng.normal(0, 0.1, DIM).astype(np.float32)
                f[k] += 1
                if colour:
                    f[4 + COLOURS.index(colour)] += 1
                f[8:10] = [(box[0] + box[2]) / 2 / w, (box[1] + box[3]) / 2 / h]
                feats.append(f)
                boxes.append(np.asarray(box, dtype=np.float32))
        for _ in range(int(rng.integers(1, 4))):
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            boxes.append(np.array([x0, y0, x0 + w / 3, y0 + h / 3], dtype=np.float32))
            feats.append(rng.normal(0, 0.1, DIM).astype(np.float32))
        out[r.image_id] = (np.stack(feats), np.stack(boxes), (h, w))
    return out


def tsv_line(image_id: int, feats: np.ndarray, boxes: np.ndarray, size: tuple[int, int]) -> str:
    b64 = [base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode() for a in (boxes, feats)]
    return "\t".join(map(str, (image_id, size[1], size[0], len(feats), *b64))) + "\n"


def write_tsv(path: Path, regions: dict) -> Path:
    path.write_text("".join(tsv_line(i, f, b, s) for i, (f, b, s) in regions.items()))
    return path


@pytest.fixture
def regions(shapes_json):
    records = [r for split in ("train", "val", "test") for r in read_karpathy(shapes_json, split)]
    return shapes_regions(records)


def two_tsv(tmp_path: Path, regions: dict) -> list[Path]:
    ids = list(regions)
    half = len(ids) // 2
    return [write_tsv(tmp_path / f"part{k}.tsv", {i: regions[i] for i in part})
            for k, part in enumerate((ids[:half], ids[half:]))]


def test_a_converted_cache_holds_every_image_s_regions_and_boxes(regions, tmp_path):
    meta = convert_tsv(two_tsv(tmp_path, regions), tmp_path / "cache", progress_bar=False, flush_every=7)
    assert (meta["images"], meta["dim"], meta["skipped"]) == (len(regions), DIM, 0)
    assert meta["regions"] == sum(len(f) for f, _, _ in regions.values())
    cache = open_regions(tmp_path / "cache", DIM)
    assert isinstance(cache, RegionCache) and cache.sets and len(cache) == len(regions)
    counts = {len(f) for f, _, _ in regions.values()}
    assert len(counts) > 2  # the images hold different numbers of regions
    for image_id, (feats, boxes, size) in regions.items():
        np.testing.assert_array_equal(cache[image_id].numpy(), feats.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(cache.boxes(image_id), boxes)
        assert cache.size(image_id) == size
    assert not (tmp_path / "cache" / "progress.json").exists()
    with pytest.raises(RegionError, match="already holds a finished region cache"):
        convert_tsv(two_tsv(tmp_path, regions), tmp_path / "cache", progress_bar=False)


def test_an_interrupted_conversion_continues_to_the_same_bytes(regions, tmp_path, monkeypatch):
    files = two_tsv(tmp_path, regions)
    convert_tsv(files, tmp_path / "whole", progress_bar=False)
    add, calls = regions_tsv._add, []

    def dies_at_the_20th(*args):
        calls.append(1)
        if len(calls) == 20:
            args[4].write(b"half a row")  # bytes written after the last progress record: cut off on resume
            raise KeyboardInterrupt
        add(*args)

    monkeypatch.setattr(regions_tsv, "_add", dies_at_the_20th)
    with pytest.raises(KeyboardInterrupt):
        convert_tsv(files, tmp_path / "parts", progress_bar=False, flush_every=3)
    with pytest.raises(FileNotFoundError, match="rerun the same command to finish it"):
        RegionCache.open(tmp_path / "parts")
    assert json.loads((tmp_path / "parts" / "progress.json").read_text())["rows_done"] == 18
    monkeypatch.setattr(regions_tsv, "_add", add)
    with pytest.raises(RegionError, match="holds a conversion of other files"):
        convert_tsv(files[:1], tmp_path / "parts", progress_bar=False)
    convert_tsv(files, tmp_path / "parts", progress_bar=False)
    for name in ("features.bin", "boxes.bin", "index.json"):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_bad_lines_stop_with_their_file_and_line_and_unusable_images_are_counted_skips(regions, tmp_path):
    (i, (f, b, s)), (j, rest) = list(regions.items())[:2]
    good = tsv_line(i, f, b, s)
    cases = [("1\t2\t3\n", r"bad\.tsv:2: 3 tab-separated fields"),
             (good.replace("\t", "\tx", 1), r"bad\.tsv:2: image_id, image_w, image_h and num_boxes must be integers"),
             (tsv_line(j, rest[0][:, :5], rest[1][:1], rest[2]), r"bad\.tsv:2: image .* gives .* boxes but 4 box"),
             (good[:-30] + "!!\n", r"bad\.tsv:2: field 'features' is not base64"),
             (good, r"bad\.tsv:2: image .* appears a second time"),
             (tsv_line(j, rest[0][:, :8], rest[1], rest[2]), r"has 8 values per region, the images before it 16")]
    for k, (line, message) in enumerate(cases):
        bad = tmp_path / f"case{k}" / "bad.tsv"
        bad.parent.mkdir()
        bad.write_text(good + line)
        with pytest.raises(RegionError, match=message):
            convert_tsv([bad], tmp_path / f"case{k}" / "cache", progress_bar=False)
    nan = f.copy()
    nan[0, 0] = np.nan
    mixed = write_tsv(tmp_path / "mixed.tsv", {i: (nan, b, s), j: rest, 99: (f[:0], b[:0], s)})
    meta = convert_tsv([mixed], tmp_path / "mixed", progress_bar=False)
    assert (meta["images"], meta["skipped"]) == (1, 2)
    cache = RegionCache.open(tmp_path / "mixed", DIM)
    assert i in cache and 99 in cache  # held, so a data set counts them as skipped images
    with pytest.raises(ImageError, match="NaN or inf"):
        cache[i]
    with pytest.raises(ImageError, match="no regions"):
        cache[99]


def test_the_free_space_is_checked_before_anything_is_written(regions, tmp_path, monkeypatch):
    monkeypatch.setattr(regions_tsv, "free_bytes", lambda path: 1000)
    with pytest.raises(NotEnoughSpaceError, match=r"need about .* GB more \(3/8 of their size\), but only .* GB are free"):
        convert_tsv(two_tsv(tmp_path, regions), tmp_path / "cache", progress_bar=False)
    assert not (tmp_path / "cache" / "features.bin").exists()


def test_a_damaged_or_foreign_cache_is_refused_in_one_line(regions, tmp_path):
    convert_tsv(two_tsv(tmp_path, regions), tmp_path / "cache", progress_bar=False)
    with pytest.raises(RegionError, match="holds 16 values per region, but encoder.dim=2048; set encoder.dim=16"):
        RegionCache.open(tmp_path / "cache", 2048)
    data = (tmp_path / "cache" / "features.bin").read_bytes()
    (tmp_path / "cache" / "features.bin").write_bytes(data[:-2])
    with pytest.raises(RegionError, match=r"features\.bin is \d+ bytes but index\.json's \d+ regions"):
        RegionCache.open(tmp_path / "cache", DIM)
    (tmp_path / "cache" / "index.json").write_text('{"image_ids": [1]}')
    with pytest.raises(RegionError, match="needs the lists image_ids, counts and sizes"):
        RegionCache.open(tmp_path / "cache", DIM)


def npz_folder(root: Path, regions: dict) -> Path:
    (root / "bu_att").mkdir(parents=True)
    (root / "bu_box").mkdir()
    for i, (f, b, _) in regions.items():
        np.savez_compressed(root / "bu_att" / f"{i}.npz", feat=f)
        np.save(root / "bu_box" / f"{i}.npy", b)
    return root / "bu_att"


def test_a_folder_of_npz_files_is_read_with_its_sibling_boxes(regions, shapes_json, tmp_path):
    folder = open_regions(npz_folder(tmp_path, regions), DIM)
    assert isinstance(folder, RegionFolder) and folder.box_root == tmp_path / "bu_box"
    i, (f, b, _) = next(iter(regions.items()))
    np.testing.assert_array_equal(folder[i].numpy(), f)
    np.testing.assert_array_equal(folder.boxes(i), b)
    folder.require(read_karpathy(shapes_json, "test"))
    (tmp_path / "bu_att" / f"{i}.npz").unlink()
    with pytest.raises(RegionError, match=rf"1 of \d+ images have no regions in .*bu_att \(e\.g\. image ids \[{i}\]\)"):
        folder.require([r for r in read_karpathy(shapes_json, "train") if r.image_id == i]
                       or read_karpathy(shapes_json, "train"))
    (tmp_path / "bu_att" / f"{i}.npz").write_bytes(b"not a zip")
    with pytest.raises(RegionError, match="is not a readable .npy/.npz file"):
        folder[i]
    j = list(regions)[1]
    np.savez(tmp_path / "bu_att" / f"{j}.npz", feat=np.zeros((3, 5), np.float32))
    with pytest.raises(RegionError, match=r"holds float32 3x5, not regions x 16 numbers"):
        folder[j]


@pytest.mark.parametrize("form", ["tsv", "npz"])
def test_a_model_on_region_features_trains_evaluates_and_refuses_export(form, regions, shapes_json, tmp_path, capsys):
    from fixtures import compose_config

    from captioning.evaluate import evaluate
    from captioning.export.graphs import refusal
    from captioning.factory.load import load_model
    from captioning.train import train

    if form == "tsv":
        assert convert_main(["--tsv", *map(str, two_tsv(tmp_path, regions)), "--out", str(tmp_path / "feats"),
                             "--no-progress"]) == 0
        source = tmp_path / "feats"
    else:
        source = npz_folder(tmp_path / "npz", regions)
    cfg = compose_tiny_train(shapes_json, "encoder=regions", f"encoder.dim={DIM}", f"dataset.features={source}",
                             "trainer.max_epochs=2")
    metrics = train(cfg, tmp_path / "run")
    assert metrics["num_images"] == 12 and metrics["skipped_images"] == 0 and "CIDEr" in metrics
    model, _, _ = load_model(tmp_path / "run" / "checkpoints" / "best.pt")
    assert refusal(model).startswith("a model on region features (encoder=regions) has no image path")
    with pytest.raises(ValueError, match="encoder=regions reads region features"):
        model.generate(torch.zeros(1, 3, 32, 32))
    again = evaluate(compose_config(f"checkpoint={tmp_path / 'run/checkpoints/best.pt'}", "eval.metrics=[bleu]",
                                    name="evaluate"), tmp_path / "eval")
    assert again["Bleu_4"] == metrics["Bleu_4"]
    if form == "npz":  # captioning image files: one line
        from captioning.tools.caption import main as caption_main

        image = read_karpathy(shapes_json, "test")[0].path
        capsys.readouterr()  # what evaluation printed
        with pytest.raises(SystemExit) as exit_:
            caption_main([str(image), "--checkpoint", str(tmp_path / "run/checkpoints/best.pt")])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().startswith("captioning-caption: error: encoder=regions reads region")


def test_region_weights_are_painted_on_their_boxes_keeping_their_sum():
    from captioning.evaluation.region_maps import box_cells, paint

    # a 40 x 80 image (height x width) on a 4 x 4 grid: cells of 10 x 20 pixels
    boxes = np.array([[0, 0, 40, 20],  # the top-left 2 x 2 cells, a quarter each
                      [60, 30, 80, 40],  # exactly the bottom-right cell
                      [70, 35, 70, 35],  # no area: all in the cell holding the point
                      [-20, 30, 20, 60]])  # half outside: clipped to [0, 20) x [30, 40), the bottom-left cell
    cells = box_cells(boxes, (40, 80), 4)
    np.testing.assert_allclose(cells.sum((1, 2)), 1.0)
    np.testing.assert_allclose(cells[0][:2, :2], 0.25)
    assert cells[1][3, 3] == cells[2][3, 3] == cells[3][3, 0] == 1.0
    alphas = torch.tensor([[[0.5, 0.25, 0.125, 0.125]], [[0.0, 0.0, 0.0, 0.0]]])
    maps = paint(alphas, boxes, (40, 80), 4)
    assert maps.shape == (2, 4, 4) and maps[1].abs().sum() == 0
    torch.testing.assert_close(maps[0].sum(), torch.tensor(1.0))
    torch.testing.assert_close(maps[0, 3, 3], torch.tensor(0.375))
    torch.testing.assert_close(maps[0, 0, 0], torch.tensor(0.125))
    assert paint(alphas[:0], boxes, (40, 80), 4).shape == (0, 4, 4)  # an empty caption: no word, no map


def test_evaluation_on_regions_with_boxes_draws_figures_and_scores_attention_correctness(regions, shapes_json, tmp_path):
    """With boxes, each word's region weights are painted over the image: figures, the report's maps and attention
    correctness on the `shapes` boxes."""
    from captioning.evaluation.region_maps import REGION_GRID
    from captioning.train import train

    convert_tsv(two_tsv(tmp_path, regions), tmp_path / "feats", progress_bar=False)
    cfg = compose_tiny_train(shapes_json, "encoder=regions", f"encoder.dim={DIM}", f"dataset.features={tmp_path / 'feats'}",
                             "trainer.max_epochs=1", "eval.num_figures=2")
    metrics = train(cfg, tmp_path / "run")
    assert 0 <= metrics["attention_correctness"] <= 1 and metrics["attention_words"] > 0
    assert len(list((tmp_path / "run" / "figures").glob("*.png"))) == 2
    with np.load(tmp_path / "run" / "attention.npz") as maps:
        first = maps[maps.files[0]]
    assert first.shape[1:] == (REGION_GRID, REGION_GRID)
    np.testing.assert_allclose(first.sum((1, 2)), 1.0, atol=1e-3)


@pytest.mark.parametrize("name", ["updown", "att2in", "att2all", "aoa", "m2", "transformer", "fc"])
def test_the_bottom_up_presets_are_their_grid_presets_on_regions(name):
    """experiment=coco_<name>_bu: the same model and training as coco_<name>, on 2048-wide region features."""
    from fixtures import compose_config
    from omegaconf import OmegaConf

    grid, bu = compose_config(f"experiment=coco_{name}"), compose_config(f"experiment=coco_{name}_bu")
    assert OmegaConf.to_container(bu.encoder) == {"_target_": "regions", "dim": 2048}
    assert str(bu.dataset.features).endswith("coco/regions") and grid.encoder.arch == "resnet101"
    for key in ("attention", "decoder", "optim", "scheduler", "objective", "trainer"):
        same, other = (OmegaConf.to_container(c.get(key), resolve=True) for c in (grid, bu))
        if key == "decoder" and name in ("m2", "transformer"):  # the grid's positions; the regions are a set
            assert (same.pop("region_positions"), other.pop("region_positions")) == ("sinusoidal", "none")
        assert same == other, key


def test_painted_region_maps_score_attention_correctness_on_coco_instance_masks(tmp_path):
    """A word's attention on a region whose box is the named object's mask scores 1 on COCO's instance masks, on
    a box half on the object 0.5 (the painted map read as a grid over the whole image, no crop)."""
    from captioning.evaluation.region_maps import paint
    from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness, full_image

    poly = [[0.0, 0.0, 30.0, 0.0, 30.0, 40.0, 0.0, 40.0]]  # a person on the left half of a 40 x 60 image
    (tmp_path / "instances.json").write_text(json.dumps({
        "images": [{"id": 1, "height": 40, "width": 60}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "segmentation": poly, "area": 1200.0, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "person"}]}))
    instances = CocoInstances(tmp_path / "instances.json")
    boxes = np.array([[0, 0, 30, 40], [15, 0, 45, 40]], dtype=np.float32)  # on the person; half on it
    for weights, share in (([1.0, 0.0], 1.0), ([0.0, 1.0], 0.5)):
        maps = paint(torch.tensor([[0.5, 0.5], weights]), boxes, (40, 60)).numpy()  # "a man": man is step 1
        out = coco_attention_correctness([["a", "man"]], [maps], [1], instances, full_image)
        assert out["attention_correctness"] == pytest.approx(share, abs=1e-6) and out["attention_correctness_words"] == 1


def shapes_grids(records, side: int = 4, seed: int = 0) -> dict[int, np.ndarray]:
    """image id -> (side, side, DIM): each cell holds the shape and colour of the object whose box covers its centre."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in records:
        h, w = r.size
        grid = rng.normal(0, 0.1, (side, side, DIM)).astype(np.float32)
        for k, shape in enumerate(SHAPES):
            for box in r.word_boxes.get(shape, []):
                colour = next((c for c in COLOURS if list(box) in [list(b) for b in r.word_boxes.get(c, [])]), None)
                for y in range(side):
                    for x in range(side):
                        cx, cy = (x + 0.5) * w / side, (y + 0.5) * h / side
                        if box[0] <= cx < box[2] and box[1] <= cy < box[3]:
                            grid[y, x, k] += 1
                            if colour:
                                grid[y, x, 4 + COLOURS.index(colour)] += 1
        out[r.image_id] = grid
    return out


def test_per_image_grid_files_keep_their_layout_train_and_draw_maps_over_the_image(shapes_json, tmp_path):
    """The documented grid-feature format: <image id>.npz holding an (h, w, D) grid; the cells keep their layout
    (an attention that reads the grid trains on it) and the maps are drawn over the image."""
    from captioning.features.regions import GridFolder
    from captioning.train import train

    records = [r for split in ("train", "val", "test") for r in read_karpathy(shapes_json, split)]
    folder = tmp_path / "grids"
    folder.mkdir()
    grids = shapes_grids(records)
    for i, g in grids.items():
        np.savez_compressed(folder / f"{i}.npz", feat=g)
    source = open_regions(folder, DIM)
    assert isinstance(source, GridFolder) and not source.sets and source.grid == (4, 4)
    i = next(iter(grids))
    np.testing.assert_array_equal(source[i].numpy(), grids[i].reshape(16, DIM))  # rows first, as a cache stores them
    cfg = compose_tiny_train(shapes_json, "encoder=regions", f"encoder.dim={DIM}", f"dataset.features={folder}",
                             "attention=location", "trainer.max_epochs=1", "eval.num_figures=1")
    metrics = train(cfg, tmp_path / "run")
    assert 0 <= metrics["attention_correctness"] <= 1  # maps over the whole image, scored on the shapes boxes
    with np.load(tmp_path / "run" / "attention.npz") as maps:
        assert maps[maps.files[0]].shape[1:] == (4, 4)
    assert len(list((tmp_path / "run" / "figures").glob("*.png"))) == 1
    np.savez(folder / f"{i}.npz", feat=np.zeros((3, 3, DIM), np.float32))
    with pytest.raises(RegionError, match=rf"{i}.npz holds 3x3x16, not the 4 x 4 x 16 grid of the folder's other"):
        source[i]
    odd = tmp_path / "odd"
    odd.mkdir()
    np.savez(odd / "1.npz", feat=np.zeros((3, 4, DIM), np.float32))
    with pytest.raises(RegionError, match=r"1.npz holds a 3 x 4 grid: grid features must be square"):
        open_regions(odd, DIM)


def test_the_box_folder_is_named_by_a_key_and_its_absence_is_said_once(regions, shapes_json, tmp_path, caplog):
    from captioning.evaluation.region_maps import REGION_GRID
    from captioning.train import train

    (tmp_path / "feats").mkdir()
    (tmp_path / "where" / "boxes").mkdir(parents=True)
    for i, (f, b, _) in regions.items():
        np.savez_compressed(tmp_path / "feats" / f"{i}.npz", feat=f)
        np.save(tmp_path / "where" / "boxes" / f"{i}.npy", b)
    with caplog.at_level("WARNING"):
        bare = open_regions(tmp_path / "feats", DIM)
    assert bare.box_root is None and caplog.text.count("have no boxes (dataset.boxes=FOLDER") == 1
    named = open_regions(tmp_path / "feats", DIM, tmp_path / "where" / "boxes")
    i, (_, b, _) = next(iter(regions.items()))
    np.testing.assert_array_equal(named.boxes(i), b)
    with pytest.raises(FileNotFoundError, match=r"dataset.boxes=.*nowhere: no such folder"):
        open_regions(tmp_path / "feats", DIM, tmp_path / "nowhere")
    cfg = compose_tiny_train(shapes_json, "encoder=regions", f"encoder.dim={DIM}", f"dataset.features={tmp_path / 'feats'}",
                             f"dataset.boxes={tmp_path / 'where' / 'boxes'}", "trainer.max_epochs=1", "eval.num_figures=1")
    caplog.clear()
    with caplog.at_level("INFO"):
        metrics = train(cfg, tmp_path / "run")
    assert 0 <= metrics["attention_correctness"] <= 1 and "region sets without boxes" not in caplog.text
    with np.load(tmp_path / "run" / "attention.npz") as maps:
        assert maps[maps.files[0]].shape[1:] == (REGION_GRID, REGION_GRID)
