"""captioning-html's attention.npz reader on a stranger's file: a member whose .npy header declares a huge array, a
zip whose sizes lie, objects, a FIFO: each refused in one line naming the file and the member, before anything is
allocated (issue 29, item 3)."""

from __future__ import annotations

import io
import json
import os
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format

from captioning.reporting.html import load_attention, save_attention
from captioning.reporting.items import ReportItem
from captioning.reporting.npz import MAX_BYTES, UnsafeNpzError
from captioning.tools.html import main


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _npz(path, members: dict[str, bytes], image_ids: bytes | None = None):
    """An attention.npz written by hand: image_ids ([1] unless given), mark_regions, and the given raw members."""
    ids, mark = io.BytesIO(), io.BytesIO()
    np.save(ids, np.array([1], dtype=np.int64))
    np.save(mark, np.array(False))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("image_ids.npy", ids.getvalue() if image_ids is None else image_ids)
        z.writestr("mark_regions.npy", mark.getvalue())
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _set_file_size(path, member: str, size: int):
    """Make the zip's central directory say `member` holds `size` bytes (what ZipInfo.file_size reads)."""
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")  # the first central directory entry
    while True:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46: at + 46 + name_len] == member.encode():
            struct.pack_into("<I", data, at + 24, size)
            break
        at = data.index(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def _refused(path) -> tuple[str, float, int]:
    """The one-line refusal of load_attention, its time in seconds and the peak memory it allocated (bytes)."""
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        load_attention(path)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message, seconds, peak


def test_a_header_declaring_a_huge_array_is_refused_at_once(tmp_path):
    # (20000, 20000, 196) float32 is 292 GiB; the member holds its header and 1 MB of zeros (about 1 kB deflated)
    bomb = _npz(tmp_path / "bomb.npz", {"alphas_1.npy": _header((20000, 20000, 196)) + bytes(2**20)})
    message, seconds, peak = _refused(bomb)
    assert "member 'alphas_1.npy' declares a (20000, 20000, 196) float32 array" in message
    assert "zip says it holds 1048704 bytes" in message
    assert seconds < 0.5 and peak < 5 * 2**20


def test_a_bomb_whose_zip_sizes_agree_is_refused_by_the_limit(tmp_path):
    # the file: float16 maps declared as 2.24 GiB (8.94 GiB once widened to float64), the zip's record of
    # the member's size patched to match, while the file holds only a few kB
    header = _header((6000, 1000, 200), "<f2")
    bomb = _npz(tmp_path / "bomb.npz", {"alphas_1.npy": header + bytes(2**16)})
    _set_file_size(bomb, "alphas_1.npy", len(header) + 6000 * 1000 * 200 * 2)
    message, seconds, peak = _refused(bomb)
    assert message == (f"{bomb}: member 'alphas_1.npy' declares a (6000, 1000, 200) float16 array; the file's arrays "
                       "would take 8.94 GiB or more as float64, over the 2.00 GiB limit; refusing to load it")
    assert seconds < 0.5 and peak < 5 * 2**20 and bomb.stat().st_size < 10_000


def test_a_zip_that_lies_about_a_members_size_is_refused(tmp_path):
    header = _header((3, 7, 7))
    path = _npz(tmp_path / "lies.npz", {"alphas_1.npy": header + bytes(3 * 49 * 4)})
    assert load_attention(path)[0][1].shape == (3, 7, 7)  # as written: it loads
    _set_file_size(path, "alphas_1.npy", 10**9)
    message, _, _ = _refused(path)
    assert message == (f"{path}: member 'alphas_1.npy' declares a (3, 7, 7) float32 array ({len(header) + 588} bytes "
                       "with its header) but the zip says it holds 1000000000 bytes; refusing to load the file")


def test_more_ids_than_maps_are_refused_before_any_id_is_read(tmp_path):
    # 200 million int64 ids (1.5 GiB, within the limit) would be 7 GB as a Python list: the headers say the file
    # has one map, so it cannot hold more than one id
    header = _header((200_000_000,), "<i8")
    path = _npz(tmp_path / "ids.npz", {"alphas_1.npy": _header((1, 2, 2)) + bytes(16)}, header + bytes(2**12))
    _set_file_size(path, "image_ids.npy", len(header) + 200_000_000 * 8)
    message, seconds, peak = _refused(path)
    assert message == (f"{path} is not an attention file written by captioning-evaluate (image_ids, alphas_<id>, "
                       "mark_regions): member 'image_ids.npy' should hold the 1 ids of its 1 maps, got a "
                       "(200000000,) int64 array")
    assert seconds < 0.5 and peak < 5 * 2**20


@pytest.mark.parametrize("name,data,says", [
    ("alphas_1.npy", _header((2,), "|O") + bytes(16), "member 'alphas_1.npy' holds object, not plain numbers"),
    ("alphas_1.npy", _header((2,), "<U3") + bytes(24), "member 'alphas_1.npy' holds <U3, not plain numbers"),
    ("alphas_1.npy", b"\x93NUMPY\x03\x00" + bytes(20), "member 'alphas_1.npy' has .npy format version (3, 0)"),
    ("run.py", b"print('hi')", "member 'run.py' is not an .npy array"),
    ("alphas_1.npy", _header((2, 49)) + bytes(392), "member 'alphas_1.npy' has the shape (2, 49), not (T, h, w)"),
])
def test_members_that_are_not_plain_number_arrays_are_refused(tmp_path, name, data, says):
    message, _, _ = _refused(_npz(tmp_path / "odd.npz", {name: data}))
    assert says in message


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "attention.npz"
    os.mkfifo(fifo)
    message, seconds, _ = _refused(fifo)
    assert message == f"{fifo} is not a regular file (a FIFO, device or folder); refusing to read it"
    assert seconds < 0.5


def test_captioning_html_refuses_the_bomb_in_one_line(tmp_path, capsys):
    (tmp_path / "captions.json").write_text(json.dumps({"images": [], "annotations": [
        {"image_id": 1, "id": 1, "caption": "a red square"}]}))
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": 1, "caption": "a red square"}]))
    bomb = _npz(tmp_path / "attention.npz", {"alphas_1.npy": _header((20000, 20000, 196)) + bytes(2**20)})
    with pytest.raises(SystemExit) as exc:
        main(["--results", str(tmp_path / "results.json"), "--annotations", str(tmp_path / "captions.json"),
              "--attention", str(bomb), "--tokenizer", "python", "--metrics", "bleu"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err
    assert err.startswith(f"captioning-html: error: {bomb}: member 'alphas_1.npy' declares a (20000, 20000, 196)")
    assert not (tmp_path / "report.html").exists()


def test_a_real_attention_file_loads_as_before(tmp_path):
    rng = np.random.default_rng(0)
    items = [ReportItem(i, ["a", "b"], [], alphas=rng.random((2, 7, 7))) for i in (3, 4)]
    maps, mark = load_attention(save_attention(tmp_path / "attention.npz", items))
    assert sorted(maps) == [3, 4] and not mark and MAX_BYTES == 2 * 1024**3
    np.testing.assert_allclose(maps[3], items[0].alphas, atol=1e-3)
    assert issubclass(UnsafeNpzError, ValueError)
