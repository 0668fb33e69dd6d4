"""captioning-caption: any readable image gets a caption and a figure; bad files are skipped, not fatal."""

import pytest
import torch
from PIL import Image

from captioning.caption import main, open_image
from captioning.checkpoint import save_checkpoint
from captioning.data.vocab import Vocabulary
from captioning.models.captioner import build_captioner

from conftest import TINY_MODEL


def _checkpoint(tmp_path):
    vocab = Vocabulary.build([["a", "red", "circle"], ["a", "blue", "square"]])
    torch.manual_seed(0)
    model = build_captioner(TINY_MODEL, len(vocab))
    return save_checkpoint(tmp_path / "model.pt", model, vocab, {"model": TINY_MODEL})


def test_caption_many_formats_and_skip_bad_files(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (40, 30), "red").save(images / "rgb.png")
    Image.new("L", (32, 32), 128).save(images / "gray.jpg")
    Image.new("RGBA", (32, 48), (0, 0, 255, 100)).save(images / "rgba.webp")
    rotated = Image.new("RGB", (40, 20), "green")
    exif = rotated.getexif()
    exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees on display
    rotated.save(images / "rotated.jpg", exif=exif)
    (images / "notes.txt").write_text("not an image")
    paths = [images / n for n in ("rgb.png", "gray.jpg", "rgba.webp", "rotated.jpg", "notes.txt", "missing.png")]
    code = main([*map(str, paths), "--checkpoint", str(ckpt), "--beam-size", "2", "--max-len", "4",
                 "--out", str(tmp_path / "figs")])
    out, err = capsys.readouterr()
    assert code == 1
    lines = out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in paths[:4]]
    assert "not a readable image" in err and "notes.txt" in err and "no such file" in err
    assert open_image(images / "rotated.jpg").size == (20, 40)  # EXIF rotation applied
    captioned = [line for line in lines if line.split("\t")[1]]
    assert len(list((tmp_path / "figs").glob("*.png"))) == len(captioned)


def test_unreadable_checkpoint_exits_with_message(tmp_path, capsys):
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "x.png"), "--checkpoint", str(tmp_path / "nope.pt")])
    assert exit_info.value.code == 2
    assert "checkpoint not found" in capsys.readouterr().err
