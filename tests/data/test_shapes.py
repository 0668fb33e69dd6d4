"""Tests for the built-in synthetic `shapes` data set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.data.shapes import captions as shape_captions
from captioning.data.shapes import generate
from captioning.data.shapes.captions import COLOURS, RELATION_WORDS, SHAPES, SIZES
from captioning.data.shapes.generate import COLOUR_RGB, build_shapes

SMALL = dict(num_train=20, num_val=5, num_test=5, image_size=96, captions_per_image=5, object_scale=1.0)
COUNT_WORDS = {"two": 2, "three": 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    """One small build shared by the read-only checks."""
    root = tmp_path_factory.mktemp("shapes")
    path = build_shapes(root, seed=0, **SMALL)
    return root, json.loads(path.read_text())


def _pixels(root: Path, entry: dict) -> np.ndarray:
    return np.asarray(Image.open(root / entry["filepath"] / entry["filename"]).convert("RGB"), dtype=np.float32)


def _image_bytes(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "images").glob("*.png"))}


def test_determinism(tmp_path: Path) -> None:
    a = build_shapes(tmp_path / "a", seed=3, **SMALL)
    b = build_shapes(tmp_path / "b", seed=3, **SMALL)
    c = build_shapes(tmp_path / "c", seed=4, **SMALL)
    assert a.read_bytes() == b.read_bytes()
    assert _image_bytes(tmp_path / "a") == _image_bytes(tmp_path / "b")
    assert a.read_bytes() != c.read_bytes()
    assert _image_bytes(tmp_path / "a") != _image_bytes(tmp_path / "c")


def test_idempotent_and_regenerates_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = build_shapes(tmp_path, seed=0, **SMALL)
    stamp = path.stat().st_mtime_ns, (tmp_path / "images" / "train_00000.png").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("an up-to-date data set must not be regenerated")

    with monkeypatch.context() as m:
        m.setattr(generate, "render_image", fail)
        assert build_shapes(tmp_path, seed=0, **SMALL) == path
    assert (path.stat().st_mtime_ns, (tmp_path / "images" / "train_00000.png").stat().st_mtime_ns) == stamp

    # Other parameters: regenerated, and images no longer listed are removed.
    build_shapes(tmp_path, seed=1, **{**SMALL, "num_train": 10})
    data = json.loads(path.read_text())
    assert json.loads((tmp_path / "meta.json").read_text())["params"]["seed"] == 1
    assert len(data["images"]) == 20
    assert sorted(p.name for p in (tmp_path / "images").glob("*.png")) == sorted(e["filename"] for e in data["images"])


def test_interrupted_generation_is_redone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_shapes(tmp_path, seed=0, **SMALL)
    real = generate.render_image
    calls = []

    def crash_late(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(generate, "render_image", crash_late)
        build_shapes(tmp_path, seed=5, **SMALL)
    assert not (tmp_path / "dataset_shapes.json").exists()
    data = json.loads(build_shapes(tmp_path, seed=5, **SMALL).read_text())
    assert len(data["images"]) == 30


def test_counts_and_ids(built: tuple[Path, dict]) -> None:
    root, data = built
    assert data["dataset"] == "shapes"
    images = data["images"]
    assert [e["split"] for e in images] == ["train"] * 20 + ["val"] * 5 + ["test"] * 5
    assert [e["imgid"] for e in images] == list(range(30)) == [e["id"] for e in images]
    sentids = [s["sentid"] for e in images for s in e["sentences"]]
    assert len(sentids) == len(set(sentids)) == 150
    for e in images:
        assert (root / e["filepath"] / e["filename"]).is_file()
        assert e["filename"].startswith(e["split"] + "_")
        assert (e["width"], e["height"]) == (96, 96) == Image.open(root / "images" / e["filename"]).size
        raws = [s["raw"] for s in e["sentences"]]
        assert len(set(raws)) == 5
        assert e["sentids"] == [s["sentid"] for s in e["sentences"]]
        for s in e["sentences"]:
            assert s["imgid"] == e["imgid"]
            assert s["tokens"] == s["raw"].split() and s["raw"] == s["raw"].lower()
            assert 0 < len(s["tokens"]) <= shape_captions.MAX_CAPTION_TOKENS
            assert all(t.isalpha() for t in s["tokens"])


def test_objects_and_boxes(built: tuple[Path, dict]) -> None:
    root, data = built
    areas = []
    for e in data["images"]:
        objects = e["objects"]
        assert 2 <= len(objects) <= 3
        assert len({o["shape"] for o in objects}) == len(objects)
        for o in objects:
            assert o["shape"] in SHAPES and o["colour"] in COLOURS and o["size"] in SIZES
            x0, y0, x1, y1 = o["box"]
            assert 0 <= x0 < x1 <= e["width"] and 0 <= y0 < y1 <= e["height"]
        for i, a in enumerate(objects):
            for b in objects[i + 1:]:
                ax0, ay0, ax1, ay1 = a["box"]
                bx0, by0, bx1, by1 = b["box"]
                assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0
        areas.append(sum((o["box"][2] - o["box"][0]) * (o["box"][3] - o["box"][1]) for o in objects) / 96**2)
    assert np.mean(areas) < 0.35


def test_sizes_are_distinguishable(built: tuple[Path, dict]) -> None:
    _, data = built
    sides = {size: [o["box"][2] - o["box"][0] for e in data["images"] for o in e["objects"] if o["size"] == size]
             for size in SIZES}
    assert max(sides["small"]) + 6 < min(sides["large"])


def test_boxes_hold_the_drawn_object(built: tuple[Path, dict]) -> None:
    root, data = built
    palette = np.asarray([COLOUR_RGB[c] for c in COLOURS], dtype=np.float32)
    for e in data["images"]:
        pixels = _pixels(root, e)
        # Per pixel: index of the palette colour it is close to, or -1 for background.
        dist = np.linalg.norm(pixels[:, :, None, :] - palette, axis=-1)
        label = np.where(dist.min(-1) < 60, dist.argmin(-1), -1)
        outside = np.ones(label.shape, dtype=bool)
        for o in e["objects"]:
            x0, y0, x1, y1 = o["box"]
            outside[y0:y1, x0:x1] = False
            inside = label[y0:y1, x0:x1]
            counts = np.bincount(inside[inside >= 0], minlength=len(COLOURS))
            assert counts.argmax() == COLOURS.index(o["colour"])
            assert counts.max() >= 0.35 * inside.size
            # Tight box: the object's colour reaches every edge of the box.
            hit = inside == COLOURS.index(o["colour"])
            assert hit[0].any() and hit[-1].any() and hit[:, 0].any() and hit[:, -1].any()
            box_mean = pixels[y0:y1, x0:x1].reshape(-1, 3).mean(0)
            background_mean = pixels[label == -1].mean(0)
            target = np.asarray(COLOUR_RGB[o["colour"]])
            assert np.linalg.norm(box_mean - target) < np.linalg.norm(background_mean - target)
        assert (label[outside] >= 0).mean() < 0.01


def _check_caption(tokens: list[str], objects: list[dict]) -> None:
    by_shape = {o["shape"]: o for o in objects}
    nouns = [i for i, t in enumerate(tokens) if t in SHAPES]
    assert len({tokens[i] for i in nouns}) >= 2, tokens
    for i in nouns:
        assert tokens[i] in by_shape, tokens
        obj = by_shape[tokens[i]]
        j = i - 1
        while j >= 0 and (tokens[j] in COLOURS or tokens[j] in SIZES):
            assert tokens[j] in (obj["colour"], obj["size"]), tokens
            j -= 1
    for i, t in enumerate(tokens):
        if t in COUNT_WORDS:
            assert COUNT_WORDS[t] == len(objects), tokens
        if t not in RELATION_WORDS:
            continue
        a = by_shape[tokens[max(k for k in nouns if k < i)]]
        b = by_shape[tokens[min(k for k in nouns if k > i)]]
        (ax, ay), (bx, by) = [((o["box"][0] + o["box"][2]) / 2, (o["box"][1] + o["box"][3]) / 2) for o in (a, b)]
        dx, dy = ax - bx, ay - by
        expected = ("left" if dx < 0 else "right") if abs(dx) >= abs(dy) else ("above" if dy < 0 else "below")
        assert RELATION_WORDS[t] == expected, (tokens, a, b)


def test_captions_are_truthful(built: tuple[Path, dict]) -> None:
    _, data = built
    for e in data["images"]:
        for s in e["sentences"]:
            _check_caption(s["tokens"], e["objects"])


def test_captions_truthful_many_layouts() -> None:
    # Exercise the generators directly on many more layouts than a build would.
    for i in range(300):
        _, objects = generate.render_image(np.random.default_rng(i), 96)
        captions = shape_captions.make_captions(np.random.default_rng(10_000 + i), objects, 5)
        assert len(set(captions)) == 5
        for caption in captions:
            _check_caption(caption.split(), [o.to_json() for o in objects])


def test_templates_are_varied(built: tuple[Path, dict]) -> None:
    _, data = built
    starts = {" ".join(s["tokens"][:2]) for e in data["images"] for s in e["sentences"]}
    relations = {t for e in data["images"] for s in e["sentences"] for t in s["tokens"] if t in RELATION_WORDS}
    assert len(starts) >= 8
    assert relations == {"left", "above"}  # objects are named in reading order


def _named_order(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t in SHAPES]


def test_objects_are_named_in_reading_order(built: tuple[Path, dict]) -> None:
    """Left to right (a vertical pair: top to bottom), so the next object's place is predictable."""
    _, data = built
    for e in data["images"]:
        centre = {o["shape"]: ((o["box"][0] + o["box"][2]) / 2, (o["box"][1] + o["box"][3]) / 2) for o in e["objects"]}
        for s in e["sentences"]:
            named = _named_order(s["tokens"])
            for first, second in zip(named, named[1:]):
                (ax, ay), (bx, by) = centre[first], centre[second]
                vertical_pair = len(named) == 2 and abs(ay - by) > abs(ax - bx)
                assert (ay <= by) if vertical_pair else (ax <= bx), (s["tokens"], e["objects"])


def test_the_scene_decides_the_common_phrasing(built: tuple[Path, dict]) -> None:
    """As in real captions a few phrasings are frequent, and which one depends on the scene: three objects are
    counted ("three shapes including ..."), a side-by-side pair is "there is a ...", a stacked pair "the ... is"."""
    _, data = built
    kinds: dict[str, list[bool]] = {"three": [], "side by side": [], "stacked": []}
    for e in data["images"]:
        openings = {" ".join(s["tokens"][:2]) for s in e["sentences"]}
        if len(e["objects"]) == 3:
            kinds["three"].append("three shapes" in openings)
            continue
        (a, b) = [((o["box"][0] + o["box"][2]) / 2, (o["box"][1] + o["box"][3]) / 2) for o in e["objects"]]
        if abs(a[0] - b[0]) >= abs(a[1] - b[1]):
            kinds["side by side"].append("there is" in openings)
        else:
            kinds["stacked"].append(any(s["tokens"][0] == "the" for s in e["sentences"]))
    for kind, hits in kinds.items():
        assert hits and sum(hits) / len(hits) > 0.7, (kind, sum(hits), len(hits))


def test_word_boxes(built: tuple[Path, dict]) -> None:
    _, data = built
    for e in data["images"]:
        expected: dict[str, list] = {}
        for o in e["objects"]:
            expected.setdefault(o["shape"], []).append(o["box"])
            expected.setdefault(o["colour"], []).append(o["box"])
        assert set(e["word_boxes"]) == set(expected)
        for word, boxes in e["word_boxes"].items():
            assert sorted(boxes) == sorted(expected[word])
        assert all(len(e["word_boxes"][o["shape"]]) == 1 for o in e["objects"])


def test_meta_records_parameters(built: tuple[Path, dict]) -> None:
    root, _ = built
    meta = json.loads((root / "meta.json").read_text())
    assert meta["version"] == generate.GENERATOR_VERSION
    assert meta["params"] == {"seed": 0, **SMALL}


def test_rejects_bad_parameters(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        build_shapes(tmp_path, num_train=-1)
