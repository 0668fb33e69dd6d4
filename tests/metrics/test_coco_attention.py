"""Attention correctness on COCO instance masks, on a generated COCO-format file whose right answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import compose_config, tiny_overrides
from PIL import Image
from pycocotools import mask as mask_utils
from torchvision import transforms as T

from captioning.metrics.coco_attention import (
    WORD_CATEGORIES,
    CocoInstances,
    View,
    category_mentions,
    coco_attention_correctness,
    full_image,
    mask_coverage,
    resize_center_crop,
    view_geometry,
)
from captioning.metrics.coco_words import CATEGORY_WORDS, COCO_CATEGORY_IDS
from captioning.reporting.items import Prediction

PERSON, DOG, TRAFFIC_LIGHT = 1, 18, 10


def rect(x0: int, y0: int, x1: int, y1: int) -> list[list[float]]:
    """A polygon segmentation covering pixels x0..x1-1, y0..y1-1 (pycocotools rasterises it exactly so)."""
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


def rle(height: int, width: int, x0: int, y0: int, x1: int, y1: int, compressed: bool = True) -> dict:
    """An RLE segmentation of the same rectangle: compressed (string counts) or uncompressed (list counts)."""
    m = np.zeros((height, width), dtype=np.uint8, order="F")
    m[y0:y1, x0:x1] = 1
    if compressed:
        enc = mask_utils.encode(m)
        return {"size": [height, width], "counts": enc["counts"].decode("ascii")}
    flat = m.flatten(order="F")  # column-major runs, starting with a run of zeros
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    return {"size": [height, width], "counts": ([0] if flat[0] else []) + runs}


def instances_json(path: Path) -> Path:
    """Three images of different aspect ratios; every cell of their 10-pixel grids is inside or outside each mask."""
    images = [{"id": 1, "height": 40, "width": 60, "file_name": "a.jpg"},   # landscape, 4x6 cells of 10 px
              {"id": 2, "height": 60, "width": 40, "file_name": "b.jpg"},   # portrait, 6x4 cells
              {"id": 3, "height": 30, "width": 30, "file_name": "c.jpg"}]   # no annotations at all
    anns = [
        # image 1: a person on the left half (polygon), a dog on [45, 60) x [20, 40) (compressed RLE)
        {"id": 10, "image_id": 1, "category_id": PERSON, "segmentation": rect(0, 0, 30, 40), "iscrowd": 0},
        {"id": 11, "image_id": 1, "category_id": DOG, "segmentation": rle(40, 60, 45, 20, 60, 40), "iscrowd": 1},
        # image 2: people top-left (polygon) and bottom-right (uncompressed crowd RLE), plus one inside the
        # first (the union counts it once); a traffic light on the top row of cells
        {"id": 20, "image_id": 2, "category_id": PERSON, "segmentation": rect(0, 0, 20, 30), "iscrowd": 0},
        {"id": 21, "image_id": 2, "category_id": PERSON, "segmentation": rle(60, 40, 20, 30, 40, 60, False),
         "iscrowd": 1},
        {"id": 22, "image_id": 2, "category_id": PERSON, "segmentation": rect(0, 0, 10, 10), "iscrowd": 0},
        {"id": 23, "image_id": 2, "category_id": TRAFFIC_LIGHT, "segmentation": rect(0, 0, 40, 10), "iscrowd": 0},
    ]
    cats = [{"id": c, "name": n} for c, n in ((PERSON, "person"), (DOG, "dog"), (TRAFFIC_LIGHT, "traffic light"))]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


@pytest.fixture
def instances(tmp_path: Path) -> CocoInstances:
    return CocoInstances(instances_json(tmp_path / "instances.json"))


def one_hot(h: int, w: int, *cells: tuple[int, int]) -> np.ndarray:
    """An (h, w) map with equal mass on the given cells."""
    a = np.zeros((h, w))
    for r, c in cells:
        a[r, c] += 1.0 / len(cells)
    return a


def maps(h: int, w: int, n: int, at: dict[int, np.ndarray]) -> np.ndarray:
    """(n, h, w) maps, uniform except at the given word positions."""
    out = np.full((n, h, w), 1.0 / (h * w))
    for t, a in at.items():
        out[t] = a
    return out


# ------------------------------------------------------------------------------------------------
# Word table
# ------------------------------------------------------------------------------------------------
def test_table_covers_the_80_categories_without_ambiguity() -> None:
    assert len(COCO_CATEGORY_IDS) == 80 == len(CATEGORY_WORDS) and set(CATEGORY_WORDS) == set(COCO_CATEGORY_IDS)
    for name, words in CATEGORY_WORDS.items():
        assert name in words, name  # every category is named by its own name
        assert all(w == w.lower().strip() and len(w.split()) <= 2 for w in words)
    listed = [w for words in CATEGORY_WORDS.values() for w in words]
    assert len(listed) == len(set(listed)) == len(WORD_CATEGORIES)  # no word names two categories


@pytest.mark.parametrize("word, name", [
    ("people", "person"), ("men", "person"), ("women", "person"), ("man", "person"), ("woman", "person"),
    ("child", "person"), ("children", "person"), ("boy", "person"), ("girl", "person"), ("guy", "person"),
    ("lady", "person"), ("mice", "mouse"), ("knives", "knife"), ("skis", "skis"), ("sheep", "sheep"),
    ("geese", "bird"), ("buses", "bus"), ("bike", "bicycle"), ("motorbike", "motorcycle"), ("plane", "airplane"),
    ("airplane", "airplane"), ("jet", "airplane"), ("cellphone", "cell phone"), ("phone", "cell phone"),
    ("tv", "tv"), ("television", "tv"), ("sofa", "couch"), ("puppy", "dog"), ("kitten", "cat"),
    ("doughnut", "donut"), ("laptop", "laptop"), ("fridge", "refrigerator"), ("Dogs", "dog"),
])
def test_plurals_and_synonyms(word: str, name: str) -> None:
    assert category_mentions(["a", word]) == [(1, COCO_CATEGORY_IDS[name])]


def test_two_word_names_count_at_their_head_word_and_win_over_single_words() -> None:
    words = "a hot dog and a dog near traffic lights a teddy bear a bear a cell phone a tennis racket".split()
    got = [(words[t], cid) for t, cid in category_mentions(words)]
    ids = COCO_CATEGORY_IDS
    assert got == [("dog", ids["hot dog"]), ("dog", ids["dog"]), ("lights", ids["traffic light"]),
                   ("bear", ids["teddy bear"]), ("bear", ids["bear"]), ("phone", ids["cell phone"]),
                   ("racket", ids["tennis racket"])]
    # words left out on purpose name nothing
    assert category_mentions("a ski slope with a sign and a light".split()) == []


# ------------------------------------------------------------------------------------------------
# Geometry
# ------------------------------------------------------------------------------------------------
def test_mask_coverage_is_the_area_average_over_each_cell() -> None:
    mask = np.zeros((40, 60), dtype=np.uint8)
    mask[:, :25] = 1  # columns 0..24: cells of column 2 ([20, 30)) are half covered
    cov = mask_coverage(mask, full_image(40, 60), (4, 6))
    assert np.array_equal(cov, np.tile([1.0, 1.0, 0.5, 0.0, 0.0, 0.0], (4, 1)))
    # cells of a fractional size: 7 cells over 60 px -> the mean of the coverages is still the mask's area share
    assert mask_coverage(mask, full_image(40, 60), (3, 7)).mean() == pytest.approx(25 / 60, abs=1e-12)
    # a view reaching past the image (a padding crop): the padding is background
    cov = mask_coverage(np.ones((10, 10)), View(-10.0, 0.0, 10.0, 10.0), (1, 2))
    assert np.array_equal(cov, [[0.0, 1.0]])


@pytest.mark.parametrize("height, width", [(480, 640), (640, 427), (100, 100), (250, 260), (150, 90)])
def test_geometry_matches_torchvision_resize_and_centre_crop(height: int, width: int) -> None:
    """The view's pixel centres, read from a transformed image whose value is the original x (or y), agree."""
    geometry = T.Compose([T.Resize(128), T.CenterCrop(112)])
    view = view_geometry(T.Compose([geometry, T.ToTensor(), T.Normalize((0.5,), (0.5,))]))(height, width)
    assert view == resize_center_crop(128, 112)(height, width)
    xs = np.tile(np.arange(width, dtype=np.float32) + 0.5, (height, 1))  # each pixel holds its centre's x
    for axis, ramp in (("x", xs), ("y", (np.arange(height, dtype=np.float32)[:, None] + 0.5) * np.ones((1, width)))):
        seen = np.asarray(geometry(Image.fromarray(ramp.astype(np.float32))))
        assert seen.shape == (112, 112)
        lo, hi = (view.x0, view.x1) if axis == "x" else (view.y0, view.y1)
        centres = lo + (np.arange(112) + 0.5) * (hi - lo) / 112
        line = seen[56, 8:-8] if axis == "x" else seen[8:-8, 56]  # away from the borders (filter support)
        # PIL's bilinear filter is exact on a ramp up to ~0.01 - 0.02 of a view pixel; an off-by-one crop or a
        # half-pixel shift would be off by 0.5 - 1 view pixels
        assert np.abs(line - centres[8:-8]).max() < 0.02 * (hi - lo) / 112


def test_geometry_of_a_padding_crop_and_of_full_image_encoders() -> None:
    view = view_geometry(T.CenterCrop(224))(100, 300)  # pads 62 rows above, crops 38 columns off each side
    assert view == View(38.0, -62.0, 262.0, 162.0)
    assert view_geometry(T.Compose([T.ToTensor()]))(30, 40) == full_image(30, 40) == View(0.0, 0.0, 40.0, 30.0)
    with pytest.raises(ValueError, match="RandomCrop"):
        view_geometry(T.Compose([T.RandomCrop(10), T.ToTensor()]))


def test_masked_view_matches_the_transformed_mask() -> None:
    """Coverage through the geometry equals coverage of the mask pushed through the same resize + crop (nearest)."""
    height, width = 300, 420
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[40:220, 150:400] = 1
    geometry = T.Compose([T.Resize(128, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(112)])
    seen = np.asarray(geometry(Image.fromarray(mask)))
    direct = mask_coverage(seen, full_image(112, 112), (14, 14))
    mapped = mask_coverage(mask, view_geometry(geometry)(height, width), (14, 14))
    assert np.abs(direct - mapped).max() < 0.1 and abs(direct.mean() - mapped.mean()) < 0.005


# ------------------------------------------------------------------------------------------------
# The measure on a generated instances file
# ------------------------------------------------------------------------------------------------
def test_known_answers(instances: CocoInstances) -> None:
    w1 = "a man with a dog".split()  # image 1: 4x6 grid of 10 px cells
    a_in = maps(4, 6, 5, {1: one_hot(4, 6, (1, 0)), 4: one_hot(4, 6, (3, 4))})  # dog cell [40, 50) x [30, 40): half
    a_out = maps(4, 6, 5, {1: one_hot(4, 6, (2, 5)), 4: one_hot(4, 6, (0, 0))})
    a_half = maps(4, 6, 5, {1: one_hot(4, 6, (0, 0), (0, 5)), 4: one_hot(4, 6, (3, 5), (0, 5))})
    for a, expected in ((a_in, [1.0, 0.5]), (a_out, [0.0, 0.0]), (a_half, [0.5, 0.5])):
        out = coco_attention_correctness([w1], [a], [1], instances)
        assert out["attention_correctness"] == pytest.approx(np.mean(expected), abs=1e-12)
        assert out["attention_correctness_per_category"] == pytest.approx({"person": expected[0], "dog": expected[1]})
        assert out["attention_correctness_words"] == 2 and out["attention_correctness_skipped_words"] == 0


def test_a_map_with_no_mass_counts_zero_and_a_deficit_is_the_share_of_what_was_given(instances: CocoInstances) -> None:
    """Monotonic attention may attend to nothing (an all-zero map) or give less than 1 in all."""
    w1 = "a man with a dog".split()
    a = maps(4, 6, 5, {1: 0.3 * one_hot(4, 6, (1, 0)), 4: np.zeros((4, 6))})
    out = coco_attention_correctness([w1], [a], [1], instances)
    assert out["attention_correctness_per_category"] == pytest.approx({"person": 1.0, "dog": 0.0})


def test_instances_merge_and_words_without_instances_are_skipped(instances: CocoInstances) -> None:
    words = [
        "two people under a traffic light".split(),  # image 2 (portrait, 6x4 grid)
        "a cat and a dog".split(),                   # image 1: no cat there -> skipped
        "a dog in a field".split(),                  # image 3: no annotation at all -> skipped
    ]
    alphas = [
        maps(6, 4, 6, {5: one_hot(6, 4, (0, 1), (1, 1))}),  # 'light': half on the top row
        maps(4, 6, 5, {4: one_hot(4, 6, (2, 5))}),          # 'dog': a cell fully inside the dog
        maps(3, 3, 5, {}),
    ]
    out = coco_attention_correctness(words, alphas, [2, 1, 3], instances)
    # uniform attention on 'people': the two regions cover 600 + 600 of 2400 px (the nested one counts once)
    per = {"person": 0.5, "traffic light": 0.5, "dog": 1.0}
    assert out["attention_correctness_per_category"] == pytest.approx(per, abs=1e-12)
    assert out["attention_correctness"] == pytest.approx(2.0 / 3.0, abs=1e-12)
    assert out["attention_correctness_words"] == 3 and out["attention_correctness_skipped_words"] == 2
    # no category word anywhere: nothing to average
    none = coco_attention_correctness([["a", "field"]], [maps(2, 2, 2, {})], [3], instances)
    assert np.isnan(none["attention_correctness"]) and none["attention_correctness_words"] == 0


def test_crop_geometry_through_the_measure(tmp_path: Path) -> None:
    """On a 480x640 image, a 256/224 resize + centre crop hides x < 108.9: a person there gets no attention share."""
    images = [{"id": 7, "height": 480, "width": 640}]
    anns = [{"id": 1, "image_id": 7, "category_id": PERSON, "segmentation": rect(0, 0, 100, 480)},
            {"id": 2, "image_id": 7, "category_id": DOG, "segmentation": rect(100, 0, 640, 480)}]
    path = tmp_path / "crop.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": PERSON, "name": "person"}, {"id": DOG, "name": "dog"}]}))
    uniform = maps(14, 14, 2, {})
    crop = resize_center_crop(256, 224)
    got = coco_attention_correctness([["man", "dog"]], [uniform], [7], CocoInstances(path), crop)
    assert got["attention_correctness_per_category"] == pytest.approx({"dog": 1.0, "person": 0.0}, abs=1e-12)
    # without the crop the whole image counts: the person holds 100/640 of it
    whole = coco_attention_correctness([["man", "dog"]], [uniform], [7], CocoInstances(path), full_image)
    assert whole["attention_correctness_per_category"] == pytest.approx({"dog": 540 / 640, "person": 100 / 640})


def test_predictions_as_captioning_evaluate_passes_them(instances: CocoInstances) -> None:
    preds = [Prediction(0, 1, "a woman and her puppy".split(),
                        torch.from_numpy(maps(4, 6, 5, {1: one_hot(4, 6, (0, 1)), 4: one_hot(4, 6, (3, 5))})))]
    out = coco_attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                     [p.image_id for p in preds], instances, view_geometry(T.ToTensor()))
    assert out["attention_correctness"] == 1.0 and out["attention_correctness_words"] == 2


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
def test_image_ids_missing_from_the_file_are_named(instances: CocoInstances) -> None:
    with pytest.raises(ValueError, match=r"1 image ids are not in .*instances\.json \(e\.g\. \[99\]\)"):
        coco_attention_correctness([["a", "man"]], [maps(2, 2, 2, {})], [99], instances)
    with pytest.raises(ValueError, match="image 1: alphas must have shape"):
        coco_attention_correctness([["a", "man"]], [maps(2, 2, 3, {})], [1], instances)


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ('{"images": [], "categories": []}', "is not a COCO instances file"),
    ('{"images": [{"id": 1}], "annotations": [], "categories": []}', r"images\[0\] lacks \['height', 'width'\]"),
    ('{"images": [{"id": 1, "height": 2, "width": 2}], "categories": [], '
     '"annotations": [{"id": 5, "image_id": 2, "category_id": 1, "segmentation": []}]}',
     "annotation 5 refers to image id 2"),
    ('{"images": [], "annotations": [], "categories": [{"id": 3, "name": "dog"}]}', "'dog' has id 3, but COCO's is 18"),
])
def test_malformed_files_name_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad_instances.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="bad_instances.json") as err:
        CocoInstances(path)
    assert err.match(message)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        CocoInstances(tmp_path / "nowhere.json")


def test_malformed_segmentation_names_the_file_and_annotation(tmp_path: Path) -> None:
    path = tmp_path / "bad_segm.json"
    path.write_text(json.dumps({"images": [{"id": 1, "height": 4, "width": 4}], "categories": [],
                                "annotations": [{"id": 9, "image_id": 1, "category_id": 1,
                                                 "segmentation": {"size": [8, 8], "counts": [64]}}]}))
    with pytest.raises(ValueError, match=r"bad_segm\.json: annotation 9 has an RLE of size \[8, 8\]"):
        coco_attention_correctness([["a", "man"]], [maps(2, 2, 2, {})], [1], CocoInstances(path))


# ------------------------------------------------------------------------------------------------
# captioning-evaluate and captioning-train end to end (tiny models, a few seconds)
# ------------------------------------------------------------------------------------------------
@pytest.mark.integration  # trains 8 epochs end to end first
def test_evaluate_with_instances_equals_the_box_measure_when_masks_are_the_boxes(shapes_json, tmp_path, monkeypatch):
    """With instance masks drawn as the `shapes` boxes (and shape/colour words mapped to categories), the mask
    measure from `eval.instances` equals the box-based one on the same decoded split."""

    from captioning.data.readers.karpathy import read_karpathy
    from captioning.data.shapes.captions import COLOURS, SHAPES
    from captioning.evaluate import evaluate
    from captioning.metrics import coco_attention
    from captioning.train import train

    train_overrides = [*tiny_overrides(Path(shapes_json).parent), "eval.metrics=[bleu]", "eval.num_figures=0",
                       # long enough for the test captions to name shapes: the last of 8 epochs names 18 (4 epochs
                       # named 13 with dense teacher forcing, none with real words only: other dropout draws; with
                       # the default exponential schedule the best checkpoint names none)
                       "trainer.max_epochs=8", "optim.lr=0.01", "scheduler=plateau"]
    train(compose_config(*train_overrides), tmp_path / "run")

    # every shape and colour word names its own COCO category; each of its boxes is one instance polygon
    names = ["person", "dog", "traffic light", "car", "cat", "bus", "boat", "bench"]
    word_ids = {w: COCO_CATEGORY_IDS[n] for w, n in zip((*SHAPES, *COLOURS), names)}
    monkeypatch.setattr(coco_attention, "WORD_CATEGORIES", word_ids)
    records = read_karpathy(shapes_json, "test")
    anns = []
    for r in records:
        for w, boxes in r.word_boxes.items():
            anns += [{"id": len(anns) + i, "image_id": r.image_id, "category_id": word_ids[w], "segmentation": rect(*b)}
                     for i, b in enumerate(boxes)]
    images = [{"id": r.image_id, "height": r.size[0], "width": r.size[1]} for r in records]
    cats = [{"id": COCO_CATEGORY_IDS[n], "name": n} for n in names]
    good = tmp_path / "instances.json"
    good.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))

    def run(*extra: str) -> dict:
        cfg = compose_config(f"checkpoint={tmp_path / 'run/checkpoints/best.pt'}", "eval.metrics=[bleu]",
                             "eval.num_figures=0", *extra, name="evaluate")
        return evaluate(cfg, tmp_path / "eval")

    boxes = run()
    masks = run(f"eval.instances={good}")
    assert masks["attention_correctness_words"] == boxes["attention_words"] > 0
    assert masks["attention_correctness"] == pytest.approx(boxes["attention_correctness"], abs=1e-9)
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["attention_correctness_per_category"] == pytest.approx(masks["attention_correctness_per_category"])

    # an instances file of other images fails before decoding, naming the file
    other = tmp_path / "other_instances.json"
    other.write_text(json.dumps({"images": images[1:], "annotations": [], "categories": cats}))
    with pytest.raises(ValueError, match=r"1 image ids are not in .*other_instances\.json"):
        run(f"eval.instances={other}")

    # captioning-train with eval.instances reports the same measure for its test split (same seed, same model)
    trained = train(compose_config(*train_overrides, f"eval.instances={good}"), tmp_path / "run2")
    assert trained["attention_correctness_words"] == masks["attention_correctness_words"]
    assert trained["attention_correctness"] == pytest.approx(masks["attention_correctness"], abs=1e-9)
    with pytest.raises(ValueError, match="other_instances"):
        train(compose_config(*train_overrides, f"eval.instances={other}"), tmp_path / "run3")
    assert not (tmp_path / "run3" / "checkpoints").exists()  # refused before training
