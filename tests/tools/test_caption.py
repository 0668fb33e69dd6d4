"""captioning-caption: any readable image gets a caption and a figure; bad files are skipped, not fatal."""

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL
from PIL import Image

from captioning.checkpoint import save_checkpoint
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner
from captioning.tools.caption import figure_names, main, open_image


def _checkpoint(tmp_path, model_cfg=TINY_MODEL):
    vocab = Vocabulary.build([["a", "red", "circle"], ["a", "blue", "square"]])
    torch.manual_seed(0)
    model = build_captioner(model_cfg, len(vocab))
    return save_checkpoint(tmp_path / "model.pt", model, vocab, {"model": model_cfg})


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
    Image.fromarray(np.full((32, 32), 30000, dtype=np.uint16)).save(images / "grey16.png")
    (images / "notes.txt").write_text("not an image")
    names = ("rgb.png", "gray.jpg", "rgba.webp", "rotated.jpg", "grey16.png", "notes.txt", "missing.png")
    paths = [images / n for n in names]
    code = main([*map(str, paths), "--checkpoint", str(ckpt), "--beam-size", "2", "--max-len", "4",
                 "--figures", str(tmp_path / "figs")])
    out, err = capsys.readouterr()
    assert code == 1
    lines = out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in paths[:5]]
    assert "cannot read image" in err and "notes.txt" in err and "image file not found" in err
    lines_err = err.strip().splitlines()
    assert len(lines_err) == 3  # one line per skipped image, then the summary
    assert lines_err[-1].startswith("captioning-caption: captioned 5 images") and "skipped 2" in lines_err[-1]
    assert open_image(images / "rotated.jpg").size == (20, 40)  # EXIF rotation applied
    assert open_image(images / "grey16.png").getpixel((0, 0)) == (117, 117, 117)  # 30000 / 65535 * 255, not white
    captioned = [line for line in lines if line.split("\t")[1]]
    assert len(list((tmp_path / "figs").glob("*.png"))) == len(captioned)
    assert f"{len(captioned)} figures in {tmp_path / 'figs'}" in lines_err[-1]  # says where the figures went


def test_same_file_names_in_different_folders_keep_their_own_figures(tmp_path, capsys):
    paths = []
    for folder, colour in (("a", "red"), ("b", "blue")):
        (tmp_path / folder).mkdir()
        Image.new("RGB", (32, 32), colour).save(tmp_path / folder / "x.png")
        paths.append(tmp_path / folder / "x.png")
    Image.new("RGB", (32, 32), "green").save(tmp_path / "y.jpg")
    assert figure_names([*paths, tmp_path / "y.jpg"]) == ["a_x.png", "b_x.png", "y.png"]
    assert figure_names([paths[0], paths[0]]) == ["a_x_0.png", "a_x_1.png"]  # the same file twice
    vocab = Vocabulary.build([["a", "red", "circle"]])
    model = build_captioner(TINY_MODEL, len(vocab))
    with torch.no_grad():
        model.decoder.L_o.bias[vocab.stoi["a"]] = 50.0  # always says "a": every image gets a figure
    ckpt = save_checkpoint(tmp_path / "word.pt", model, vocab, {"model": TINY_MODEL})
    assert main([*map(str, paths), "--checkpoint", str(ckpt), "--max-len", "2", "--figures", str(tmp_path / "f")]) == 0
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["a_x.png", "b_x.png"]


def test_tiny_images_are_resized_by_an_encoder_with_an_image_size(tmp_path, capsys):
    cfg = {**TINY_MODEL, "encoder": {**TINY_MODEL["encoder"], "image_size": 32}}
    ckpt = _checkpoint(tmp_path, cfg)
    Image.new("RGB", (1, 1), "red").save(tmp_path / "dot.png")
    assert main([str(tmp_path / "dot.png"), "--checkpoint", str(ckpt), "--figures", str(tmp_path / "f")]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'dot.png'}\t")
    # Without image_size a 1 x 1 image is too small for the pooling: skipped with a reason, never a traceback.
    ckpt = _checkpoint(tmp_path)
    assert main([str(tmp_path / "dot.png"), "--checkpoint", str(ckpt), "--figures", str(tmp_path / "f")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"captioning-caption: skipped: cannot caption {tmp_path / 'dot.png'}: ") and err.count("\n") == 2


@pytest.mark.parametrize("options, message", [
    (["--beam-size", "0"], "argument --beam-size: must be >= 1, got 0"),
    (["--beam-size", "-2"], "argument --beam-size: must be >= 1, got -2"),
    (["--max-len", "0"], "argument --max-len: must be >= 1, got 0"),
    (["--max-len", "two"], "argument --max-len: expected a whole number >= 1, got 'two'"),
    (["--figures", "{file}/figs"], "cannot write to the folder"),
    (["--results", "{tmp}"], "it is a folder"),
    (["--resume"], "--resume continues a run from its --jsonl log"),
    (["--alternatives", "21"], "argument --alternatives: at most 20, got 21"),
    (["--list", "{tmp}/nope.txt"], "list of images not found"),
    (["--results", "{tmp}/r.json"], "no image id"),
    (["--annotations", "{file}"], "either --annotations"),
    (["--checkpoint", "{tmp}/nope.pt"], "checkpoint not found"),
    (["--checkpoint", "{file}"], "is not a readable captioning checkpoint"),
    (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "nonsense"], "device"),
])
def test_bad_options_and_files_exit_2_with_one_line(tmp_path, capsys, options, message):
    ckpt = _checkpoint(tmp_path)
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    options = [o.format(file=tmp_path / "x.png", tmp=tmp_path) for o in options]
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "x.png"), "--checkpoint", str(ckpt), *options])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.startswith("captioning-caption: error: ") and err.count("\n") == 1
