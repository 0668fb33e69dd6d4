"""captioning-caption over many images: a split's results score as evaluation's metrics.json, folders and lists
are searched as documented, and an interrupted run continues with the same results."""

import json
import shutil

import pytest

import captioning.tools.caption as caption_tool
from captioning.data.readers.karpathy import read_karpathy
from captioning.tools.caption import main
from captioning.tools.score import score_files


@pytest.fixture(scope="module")
def best(trained_run):
    return str(trained_run / "checkpoints" / "best.pt")


def test_a_split_captioned_here_scores_as_the_run_evaluated_it(trained_run, shapes_json, best, tmp_path):
    results = tmp_path / "r.json"
    assert main(["--annotations", str(shapes_json), "--split", "test", "--checkpoint", best, "--beam-size", "3",
                 "--results", str(results), "--batch-size", "5"]) == 0
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["beam_size"] == 3
    ours = score_files(shapes_json, results, ("bleu", "rouge", "cider"), tokenizer=metrics["tokenizer"])
    for key in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"):
        assert ours[key] == metrics[key], key
    assert json.loads(results.read_text()) == sorted(json.loads((trained_run / "results.json").read_text()),
                                                     key=lambda r: r["image_id"])


@pytest.fixture
def folder(shapes_json, tmp_path):
    """Test images as COCO-named files in nested folders, plus a text file, a corrupt image and a JPEG list."""
    root = tmp_path / "photos"
    for n, record in enumerate(read_karpathy(shapes_json, "test")):
        sub = root / ("a" if n % 2 else "b/c")
        sub.mkdir(parents=True, exist_ok=True)
        shutil.copy(record.path, sub / f"COCO_val2014_{record.image_id:012d}.png")
    (root / "notes.txt").write_text("not an image")
    (root / "a" / "COCO_val2014_000000099999.PNG").write_bytes(b"\x89PNG broken")
    return root


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_folders_are_searched_recursively_and_bad_images_counted(folder, best, tmp_path, capsys):
    jsonl, results = tmp_path / "out.jsonl", tmp_path / "r.json"
    code = main([str(folder), "--checkpoint", best, "--jsonl", str(jsonl), "--results", str(results),
                 "--batch-size", "4", "--alternatives", "2"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""  # one image unreadable; outputs go to files, not stdout
    rows = _lines(jsonl)
    pngs = sorted(p for p in folder.rglob("*") if p.suffix.lower() == ".png")  # .PNG too: any letter case
    assert len(pngs) == 13 and len(rows) == 12
    assert sorted(r["path"] for r in rows) == sorted(str(p) for p in pngs if "99999" not in p.name)
    assert all(r["image_id"] == int(r["path"][-16:-4]) for r in rows)  # the digits ending the file name
    assert all(r["alternatives"][0]["caption"] == r["caption"] and len(r["alternatives"]) <= 2 for r in rows)
    assert [r["image_id"] for r in json.loads(results.read_text())] == sorted(r["image_id"] for r in rows)
    assert "skipped: cannot read image" in err and "COCO_val2014_000000099999.PNG" in err
    last = err.strip().splitlines()[-1]
    assert "captioned 12 images" in last and "skipped 1" in last and f"results: {results} (12 images)" in last
    # --glob picks what a folder gives; a --list file names paths relative to itself
    listing = folder / "some.txt"
    listing.write_text("# two images\n" + "\n".join(str(p.relative_to(folder)) for p in pngs[:2]) + "\n\n")
    assert main(["--list", str(listing), "--checkpoint", best]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [str(p) for p in pngs[:2]]
    assert main([str(folder / "b"), "--glob", "*000000000*.png", "--checkpoint", best]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6


def test_an_interrupted_run_continues_with_the_same_results(folder, best, tmp_path, capsys, monkeypatch):
    (folder / "a" / "COCO_val2014_000000099999.PNG").unlink()
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    args = [str(folder), "--checkpoint", best, "--batch-size", "3"]
    assert main([*args, "--jsonl", str(full), "--results", str(tmp_path / "full.json")]) == 0
    real, calls = caption_tool._caption, []

    def stop_on_third_batch(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(caption_tool, "_caption", stop_on_third_batch)
    with pytest.raises(SystemExit) as stop:
        main([*args, "--jsonl", str(part), "--results", str(tmp_path / "part.json")])
    assert stop.value.code == 130
    assert f"6 captions are in {part}: run the same command with --resume" in capsys.readouterr().err
    monkeypatch.setattr(caption_tool, "_caption", real)
    with part.open("a") as f:
        f.write('{"path": "half a li')  # a kill in the middle of a write
    with pytest.raises(SystemExit):  # an existing log is never overwritten
        main([*args, "--jsonl", str(part)])
    assert "pass --resume" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # nor continued with other settings
        main([*args, "--jsonl", str(part), "--resume", "--beam-size", "2"])
    assert "beam_size: 3 then, 2 now" in capsys.readouterr().err
    assert main([*args, "--jsonl", str(part), "--results", str(tmp_path / "part.json"), "--resume"]) == 0
    assert "captioned 6 images" in capsys.readouterr().err.splitlines()[-1]
    assert sorted(_lines(part), key=lambda r: r["path"]) == sorted(_lines(full), key=lambda r: r["path"])
    assert (tmp_path / "part.json").read_text() == (tmp_path / "full.json").read_text()


def test_image_ids_from_a_mapping_and_clashes_refused(folder, best, tmp_path, capsys):
    one, two = sorted(folder.rglob("*.png"))[:2]
    mapping = tmp_path / "ids.json"
    mapping.write_text(json.dumps({one.name: 7, str(two): 8}))
    assert main([str(one), str(two), "--checkpoint", best, "--id-map", str(mapping),
                 "--results", str(tmp_path / "r.json")]) == 0
    assert [r["image_id"] for r in json.loads((tmp_path / "r.json").read_text())] == [7, 8]
    mapping.write_text(json.dumps({one.name: 7, two.name: 7}))
    with pytest.raises(SystemExit):
        main([str(one), str(two), "--checkpoint", best, "--id-map", str(mapping), "--results", str(tmp_path / "r.json")])
    assert "image id 7 is given to both" in capsys.readouterr().err
