"""Image paths from annotation files stay under the image root (SECURITY.md: annotation files are data): an absolute
path, a `..` or a symlink out of the root is refused in one line naming the file, the entry and the field, before any
image is read; symlinks that stay inside the root, and a root that is itself a symlink, are fine."""

import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from captioning.data.readers import paths
from captioning.data.readers.coco_captions import read_coco_captions
from captioning.data.readers.karpathy import read_karpathy, read_karpathy_splits
from captioning.data.readers.references import read_annotations
from captioning.data.readers.table import read_table
from captioning.tools.html import main as html_main

SECRET = (13, 200, 77)  # the colour of the image outside the root


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """root/images/a.png, an image outside the root, and symlinks: out of the root (a file and a folder) and in it."""
    tmp_path = tmp_path.resolve()  # the messages show resolved paths
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "images").mkdir(parents=True)
    outside.mkdir()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(root / "images" / "a.png")
    Image.new("RGB", (8, 8), SECRET).save(outside / "secret.png")
    (root / "images" / "link.png").symlink_to(outside / "secret.png")  # a file link out of the root
    (root / "escape").symlink_to(outside, target_is_directory=True)  # a folder link out of the root
    (root / "images" / "inner.png").symlink_to(root / "images" / "a.png")  # a file link inside the root
    (root / "alias").symlink_to(root / "images", target_is_directory=True)  # a folder link inside the root
    return {"tmp": tmp_path, "root": root, "outside": outside, "secret": outside / "secret.png"}


def _entry(image_id: int, filepath: str, filename: str, split: str = "test") -> dict:
    return {"cocoid": image_id, "split": split, "filepath": filepath, "filename": filename,
            "sentences": [{"raw": "a red square", "tokens": ["a", "red", "square"]}]}


def _karpathy(path: Path, entries: list[dict]) -> Path:
    """A Karpathy file whose images[0] (id 1) is a good train image, then `entries`."""
    path.write_text(json.dumps({"images": [_entry(1, "images", "a.png", "train"), *entries]}))
    return path


# -- the string check -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("filepath, filename, field, says", [
    ("", "/etc/passwd", "filename", "must be a path relative to the image root, got the absolute path '/etc/passwd'"),
    ("/etc", "passwd", "filepath", "must be a path relative to the image root, got the absolute path '/etc'"),
    ("", "C:\\x.png", "filename", "must be a path relative to the image root, got the absolute path 'C:\\\\x.png'"),
    ("\\\\server\\share", "x.png", "filepath", "must be a path relative to the image root, got the absolute path "
     "'\\\\\\\\server\\\\share'"),
    ("images", "../../outside/secret.png", "filename", "must stay under the image root (no '..'), got "
     "'../../outside/secret.png'"),
    ("images/../..", "outside/secret.png", "filepath", "must stay under the image root (no '..'), got 'images/../..'"),
    ("images", "..\\a.png", "filename", "must stay under the image root (no '..'), got '..\\\\a.png'"),
    ("images", "a.png\0.jpg", "filename", "must not contain a NUL byte, got 'a.png\\x00.jpg'"),
    ("images", "./", "filename", "names no file, got './'"),
])
def test_karpathy_absolute_and_dotdot_paths_are_refused(tree, filepath, filename, field, says):
    path = _karpathy(tree["root"] / "dataset.json", [_entry(7, filepath, filename)])
    with pytest.raises(ValueError) as err:
        read_karpathy(path, "train")  # the bad entry is in another split: the whole file is refused
    assert str(err.value) == f"{path}: images[1] (id 7): '{field}' {says}"


def test_the_string_check_says_what_pathlib_says():
    """`relative_problem` is plain string tests, for speed; they agree with PurePosixPath and PureWindowsPath."""
    from pathlib import PurePosixPath, PureWindowsPath

    for text in ["/x", "C:\\x", "c:x", "1:x", "\u00e9:x", ":x", "ab:c", "\\\\s\\h", "\\x", "//s/h", "a/b.png", "a\\b"]:
        absolute = PurePosixPath(text).is_absolute() or bool(PureWindowsPath(text).anchor)
        assert ("absolute" in (paths.relative_problem(text) or "")) == absolute, text
    for text, no_file in [("", True), (".", True), ("./.", True), ("/.", False), ("...", False), ("a/.", False),
                          (".hidden", False), ("./a", False)]:
        if not text.startswith("/"):
            assert ("names no file" in (paths.relative_problem(text) or "")) == no_file, text
            assert paths.relative_problem(text, folder=True) is None
    for text in ["a..b", "...", "..a/b", "a/b..", "a.../b"]:
        assert paths.relative_problem(text) is None, text


# -- the filesystem check -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("filepath, filename, field, shown", [
    ("images", "link.png", "filename", "images/link.png"),  # a symlinked file
    ("escape", "secret.png", "filepath", "escape/secret.png"),  # a symlinked folder
    ("", "escape/secret.png", "filename", "escape/secret.png"),  # the same folder, through the filename
    ("alias", "link.png", "filename", "alias/link.png"),  # an inside folder link, then an outside file link
])
def test_karpathy_symlinks_out_of_the_root_are_refused(tree, filepath, filename, field, shown):
    root = tree["root"]
    path = _karpathy(root / "dataset.json", [_entry(7, filepath, filename)])
    for read in (lambda: read_karpathy(path, "train"), lambda: read_karpathy_splits(["train"], path, root)):
        with pytest.raises(ValueError) as err:
            read()
        assert str(err.value) == (f"{path}: images[1] (id 7): '{field}' must stay under the image root {root}, "
                                  f"but {shown} resolves to {tree['secret']} through a symlink")


def test_karpathy_symlinks_inside_the_root_a_symlinked_root_and_missing_files_are_accepted(tree):
    root, tmp_path = tree["root"], tree["tmp"]
    entries = [_entry(2, "images", "inner.png"), _entry(3, "alias", "a.png"), _entry(4, "images", "gone.png"),
               _entry(5, "", "alias/inner.png")]
    path = _karpathy(tmp_path / "dataset.json", entries)
    records = read_karpathy(path, "test", root)
    assert [(r.image_id, r.path) for r in records] == [
        (2, root / "images/inner.png"), (3, root / "alias/a.png"), (4, root / "images/gone.png"),
        (5, root / "alias/inner.png")]  # the paths as the file joins them (a missing one is skipped at load time)
    (tmp_path / "via").symlink_to(root, target_is_directory=True)  # the root given through a symlink
    assert len(read_karpathy(path, "test", tmp_path / "via")) == 4
    via_json = _karpathy(tmp_path / "via" / "dataset.json", entries)  # and the default root: the file's folder
    assert [r.path for r in read_karpathy(via_json, "test")][0] == tmp_path / "via/images/inner.png"
    bad = _karpathy(tmp_path / "via" / "bad.json", [_entry(7, "images", "link.png")])
    with pytest.raises(ValueError, match=re.escape(f"'filename' must stay under the image root {tmp_path / 'via'} "
                                                   f"(= {root}), but images/link.png resolves to {tree['secret']}")):
        read_karpathy(bad, "test")


def test_each_folder_is_resolved_once_and_only_symlinked_files(tree, monkeypatch):
    """What keeps the check cheap on COCO's 123,287 images: realpath per distinct folder, and per symlinked file."""
    root = tree["root"]
    entries = [_entry(10 + k, "images" if k % 2 else "alias", f"img{k}.png") for k in range(200)]
    entries.append(_entry(5, "images", "inner.png"))
    path = _karpathy(root / "dataset.json", entries)
    resolved: list[str] = []
    realpath = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, **kw: resolved.append(p) or realpath(p, **kw))
    assert len(read_karpathy(path, "test")) == 201
    assert sorted(os.path.relpath(p, root) for p in resolved) == [".", "alias", "images", "images/inner.png"]


# -- raw COCO caption files and tables ------------------------------------------------------------------------------
def _coco(tmp_path: Path, root: Path, file_name: str) -> tuple[Path, Path]:
    """COCO caption files for images under root/train2014 and root/val2014: train's images[1] (id 7) is `file_name`."""
    (root / "train2014").mkdir(exist_ok=True)
    (root / "val2014").mkdir(exist_ok=True)
    train = [{"id": 1, "file_name": "a.png"}, {"id": 7, "file_name": file_name}]
    val = [{"id": 9, "file_name": "v.png"}]
    files = []
    for name, imgs in (("captions_train2014.json", train), ("captions_val2014.json", val)):
        anns = [{"id": 100 + k, "image_id": im["id"], "caption": "A red square."} for k, im in enumerate(imgs)]
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps({"images": imgs, "annotations": anns}))
    return files[0], files[1]


@pytest.mark.parametrize("file_name, says", [
    ("/etc/passwd", "must be a path relative to the image root, got the absolute path '/etc/passwd'"),
    ("../val2014/v.png", "must stay under the image root (no '..'), got '../val2014/v.png'"),
    ("link.png", "must stay under the image root {folder}, but link.png resolves to {secret} through a symlink"),
    ("escape/secret.png", "must stay under the image root {folder}, but escape/secret.png resolves to {secret} "
     "through a symlink"),
])
def test_coco_file_names_out_of_the_image_folder_are_refused(tree, file_name, says):
    root, tmp_path = tree["root"], tree["tmp"]
    train, val = _coco(tmp_path, root, file_name)
    (root / "train2014" / "link.png").symlink_to(tree["secret"])
    (root / "train2014" / "escape").symlink_to(tree["outside"], target_is_directory=True)
    with pytest.raises(ValueError) as err:
        read_coco_captions(train, val, ["val"], root, num_val=1, num_test=0)  # the bad image is in train
    says = says.format(folder=root / "train2014", secret=tree["secret"])
    assert str(err.value) == f"{train}: images[1] (id 7): 'file_name' {says}"


@pytest.mark.parametrize("file_name, says", [
    ("../outside/secret.png", "must stay under the image root (no '..'), got '../outside/secret.png'"),
    ("images/link.png", "must stay under the image root {root}, but images/link.png resolves to {secret} through a "
     "symlink"),
])
def test_a_coco_caption_file_given_to_the_report_with_an_image_root_is_checked_too(tree, file_name, says):
    root = tree["root"]
    train, _ = _coco(tree["tmp"], root, file_name)
    with pytest.raises(ValueError) as err:  # captioning-html --annotations COCO --image-root ROOT reads it here
        read_annotations(train, image_root=root)
    assert str(err.value) == f"{train}: images[1] (id 7): 'file_name' {says.format(root=root, secret=tree['secret'])}"
    good, _ = _coco(tree["tmp"], root, "images/inner.png")
    assert read_annotations(good, image_root=root).paths[7] == root / "images" / "inner.png"


def test_coco_symlinks_inside_the_image_folder_and_a_symlinked_folder_are_accepted(tree):
    root, tmp = tree["root"], tree["tmp"]
    (tmp / "store").mkdir()
    (root / "train2014").symlink_to(tmp / "store", target_is_directory=True)  # the image folder: a symlink
    train, val = _coco(tmp, root, "inner.png")
    Image.new("RGB", (8, 8)).save(root / "train2014" / "a.png")
    (root / "train2014" / "inner.png").symlink_to(root / "train2014" / "a.png")
    records = read_coco_captions(train, val, ["train"], root, num_val=1, num_test=0)["train"]
    assert [(r.image_id, r.path) for r in records] == [(1, root / "train2014/a.png"), (7, root / "train2014/inner.png")]
    # The image folder is image_root/train_images, the folder the file names its images in: a link from it to
    # another folder of image_root is refused too.
    (root / "train2014" / "inner.png").unlink()
    (root / "train2014" / "inner.png").symlink_to(root / "images" / "a.png")
    with pytest.raises(ValueError, match=re.escape(f"images[1] (id 7): 'file_name' must stay under the image root "
                                                   f"{root / 'train2014'} (= {tmp / 'store'}), but inner.png")):
        read_coco_captions(train, val, ["train"], root, num_val=1, num_test=0)


def test_table_symlinks_out_of_the_root_are_refused_and_inside_ones_accepted(tree):
    root = tree["root"]
    table = root / "t.csv"
    table.write_text("image,caption,split\nimages/a.png,a dog,train\nimages/inner.png,a cat,train\n"
                     "alias/a.png,a bird,train\nescape/secret.png,a cow,val\n")
    with pytest.raises(ValueError) as err:
        read_table(["train"], table)
    assert str(err.value) == (f"{table}: line 5: 'image' must stay under the image root {root}, but "
                              f"escape/secret.png resolves to {tree['secret']} through a symlink")
    table.write_text("image,caption\nimages/a.png,a dog\nimages/link.png,a cow\n")
    with pytest.raises(ValueError, match=re.escape(f"{table}: line 3: 'image' must stay under the image root {root}, "
                                                   f"but images/link.png resolves to {tree['secret']}")):
        read_table(["train"], table, val_size=0, test_size=0)
    table.write_text("image,caption\nimages/a.png,a dog\nimages/inner.png,a cat\nalias/a.png,a bird\n")
    assert len(read_table(["train"], table, val_size=0, test_size=0)["train"]) == 3


# -- end to end: captioning-html ------------------------------------------------------------------------------------
def test_captioning_html_refuses_an_outside_symlink_and_writes_no_report(tree, capsys):
    root, tmp_path = tree["root"], tree["tmp"]
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 7, "caption": "a red square"}]))
    args = ["--results", str(results), "--metrics", "bleu", "--tokenizer", "python"]
    # The payload is live: an image the annotation file names is embedded in the page.
    (root / "images" / "copy.png").write_bytes(tree["secret"].read_bytes())
    good = _karpathy(root / "good.json", [_entry(7, "images", "copy.png")])
    assert html_main([*args, "--annotations", str(good), "--out", str(tmp_path / "good.html")]) == 0
    assert 'src="data:image/jpeg;base64,' in (tmp_path / "good.html").read_text()
    capsys.readouterr()
    bad = _karpathy(root / "dataset.json", [_entry(7, "images", "link.png")])
    with pytest.raises(SystemExit) as exc:
        html_main([*args, "--annotations", str(bad)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err == (f"captioning-html: error: {bad}: images[1] (id 7): 'filename' must stay under the image root "
                   f"{root}, but images/link.png resolves to {tree['secret']} through a symlink\n")
    assert not (tmp_path / "report.html").exists()
    assert sorted(p.name for p in tmp_path.rglob("*.html")) == ["good.html"]
