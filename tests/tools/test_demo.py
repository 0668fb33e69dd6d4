"""captioning-demo: the page, the upload checks and the captions over HTTP, the server's limits (idle and trickling
clients dropped, a burst over the upload queue answered 503, connections over the cap refused), the command line,
and the page in headless chromium (upload, hover heatmaps, errors)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import logging
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL
from PIL import Image

import captioning
from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import END, Vocabulary
from captioning.factory.models import build_captioner
from captioning.inference.demo_app import make_server
from captioning.inference.demo_page import DISPLAY_SIDE
from captioning.inference.demo_server import ServerLimits
from captioning.reporting.html import quantize_maps
from captioning.tools.demo import main

BEAM, ALTERNATIVES, MAX_LEN, LIMIT = 3, 3, 5, 64 * 1024


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height RGB pixels (with almost no data): a decompression bomb's shape."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def checkpoint(shapes_json, tmp_path_factory) -> Path:
    """An untrained tiny captioner over the shapes vocabulary that never ends early: MAX_LEN words per caption."""
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    torch.manual_seed(0)
    model = build_captioner(TINY_MODEL, len(vocab))
    with torch.no_grad():
        model.decoder.L_o.bias[vocab.stoi[END]] = -30.0
    return save_checkpoint(tmp_path_factory.mktemp("demo") / "best.pt", model, vocab, {"model": TINY_MODEL})


@pytest.fixture(scope="module")
def model(checkpoint):
    return captioning.load(checkpoint, "cpu")


@pytest.fixture(scope="module")
def images(shapes_json) -> list[Path]:
    return [r.path for r in read_karpathy(shapes_json, "test")[:3]]


@pytest.fixture(scope="module")
def server(model):
    """The demo served from a thread on a free port of 127.0.0.1."""
    srv = make_server(model, "127.0.0.1", 0, BEAM, ALTERNATIVES, MAX_LEN, LIMIT)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def _upload(server, data: bytes, name: str | None = None) -> tuple[int, dict, dict]:
    """POST bytes to /caption: the status, the answer's headers and its JSON."""
    headers = {"Content-Type": "application/octet-stream", **({"X-Filename": name} if name else {})}
    request = urllib.request.Request(server.url + "caption", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def _post(server, data: bytes, name: str | None = None) -> tuple[int, dict]:
    status, _, answer = _upload(server, data, name)
    return status, answer


def _api(model, path: Path):
    return model.caption(path, beam_size=BEAM, max_len=MAX_LEN, alternatives=ALTERNATIVES)


# -- over HTTP ------------------------------------------------------------------------------------------------------
def test_the_page_is_self_contained(server):
    with urllib.request.urlopen(server.url, timeout=10) as answer:
        assert answer.status == 200 and answer.headers["Content-Type"] == "text/html; charset=utf-8"
        page = answer.read().decode()
    links = re.findall(r'\b(?:src|href|action)\s*=\s*["\']([^"\']*)', page)
    assert links and all(link.startswith("data:") or "//" not in link and ":" not in link for link in links)
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    assert "default-src 'none'" in page and '<input type="file" id="file"' in page
    assert f"images up to {LIMIT / 2**20:g} MB" in page


def test_an_upload_gets_the_apis_caption_alternatives_and_word_maps(server, model, images):
    for path in images:
        status, answer = _post(server, path.read_bytes(), path.name)
        expected = _api(model, path)
        assert status == 200 and answer["caption"] == expected.caption and len(answer["words"]) == MAX_LEN
        assert answer["words"] == expected.words and answer["log_prob"] == pytest.approx(expected.log_prob, abs=1e-4)
        assert [a["caption"] for a in answer["alternatives"]] == [a.caption for a in expected.alternatives]
        assert len(answer["alternatives"]) == ALTERNATIVES and answer["alternatives"][0]["caption"] == expected.caption
        assert [a["log_prob"] for a in answer["alternatives"]] == pytest.approx(
            [a.log_prob for a in expected.alternatives], abs=1e-4)
        maps = np.frombuffer(base64.b64decode(answer["maps"]), np.uint8).reshape(-1, answer["h"], answer["w"])
        assert len(maps) == len(answer["words"])  # one map per word
        np.testing.assert_array_equal(maps, quantize_maps(expected.attention))
        assert answer["image"].startswith("data:image/jpeg;base64,") and answer["regions"] is None
        shown = Image.open(io.BytesIO(base64.b64decode(answer["image"].split(",", 1)[1])))
        assert max(shown.size) == DISPLAY_SIDE  # the 32 px view, enlarged for the page


def test_bad_uploads_get_a_one_line_message_and_leave_no_file(server, images, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the server writes its temporary files
    png = images[0].read_bytes()
    cases = {  # name: (body, status, what the message says)
        "notes.png": (b"not an image at all", 400, "cannot read image notes.png: cannot identify image file"),
        "cut.png": (png[: len(png) // 2], 400, "cannot read image cut.png"),
        "bomb.png": (_png_header(9000, 9000), 400, "image too large: bomb.png is 9000 x 9000 = 81000000 pixels"),
        "empty.png": (b"", 400, "the upload is empty"),
        "huge.png": (b"\0" * (LIMIT + 1), 413, "the file is 0.1 MB, over the upload limit of 0.0625 MB"),
    }
    for name, (body, status, message) in cases.items():
        code, answer = _post(server, body, name)
        assert code == status and answer["error"].startswith(message), name
        assert "\n" not in answer["error"] and str(tmp_path) not in answer["error"]
    assert "decompression-bomb guard" in _post(server, _png_header(9000, 9000))[1]["error"]
    assert list(tmp_path.iterdir()) == []  # every upload's temporary file deleted
    assert _post(server, png, "ok.png")[0] == 200  # the server goes on serving


def test_missing_or_bad_length_and_unknown_paths(server):
    host, port = server.server_address[:2]

    def raw(method: str, path: str, headers: dict[str, str]) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.putrequest(method, path)  # no body and no Content-Length unless given
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        answer = conn.getresponse()
        out = answer.status, json.loads(answer.read())
        conn.close()
        return out

    status, answer = raw("POST", "/caption", {})
    assert status == 411 and "no Content-Length" in answer["error"]
    assert raw("POST", "/caption", {"Content-Length": "lots"}) == (400, {
        "error": "bad Content-Length 'lots': expected a number of bytes"})
    assert raw("GET", "/nothing", {})[0] == 404 and raw("POST", "/other", {"Content-Length": "0"})[0] == 404


def test_one_log_line_per_request_and_one_decoding_at_a_time(server, model, images, caplog):
    caplog.set_level(logging.INFO, logger="captioning.inference.demo_app")
    names = [f"log{i}-{p.name}" for i, p in enumerate(images * 2)]  # to find this test's lines among any others
    answers: list[tuple[int, dict]] = []
    threads = [threading.Thread(target=lambda p=p, n=n: answers.append(_post(server, p.read_bytes(), n)))
               for p, n in zip(images * 2, names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [status for status, _ in answers] == [200] * len(threads)
    assert sorted(a["caption"] for _, a in answers) == sorted(_api(model, p).caption for p in images * 2)
    _post(server, b"junk", "log-junk.png")

    def lines(name: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if f"{name}:" in r.getMessage()]

    deadline = time.monotonic() + 10  # a line is written once its answer is sent
    while not all(lines(n) for n in [*names, "log-junk.png"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for name in names:
        assert len(lines(name)) == 1 and '"POST /caption HTTP/1.1" 200 ' in lines(name)[0], name
    (junk,) = lines("log-junk.png")
    assert '"POST /caption HTTP/1.1" 400 ' in junk and "(cannot read image log-junk.png: cannot identify" in junk
    assert all("\n" not in r.getMessage() for r in caplog.records)


# -- under load: the server's limits ---------------------------------------------------------------------------------
@contextlib.contextmanager
def _serving(model, **limits):
    """A demo server with these ServerLimits, served from a thread on a free port of 127.0.0.1."""
    srv = make_server(model, "127.0.0.1", 0, BEAM, ALTERNATIVES, MAX_LEN, LIMIT, ServerLimits(**limits))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on a connection until it closes it (within 10 s)."""
    sock.settimeout(10)
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _trickle(address, head: bytes, drip: bytes, every: float) -> tuple[float, int, bytes]:
    """Send `head`, then `drip` one byte every `every` seconds until the server answers or closes: the seconds from
    the connection to its close, the bytes sent, and what the server sent."""
    with socket.create_connection(address, timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(head)
        sent = len(head)
        for byte in drip:
            if select.select([sock], [], [], every)[0]:  # an answer, or the close
                break
            sock.sendall(bytes([byte]))
            sent += 1
        answer = _until_closed(sock)
        return time.monotonic() - start, sent, answer


def test_idle_and_trickling_clients_are_dropped_and_delay_no_one(model, images):
    # Seconds, not the defaults' minutes; wide enough that the normal request fits before any drop on a busy machine.
    timeout, deadline, every = 2.5, 3.5, 0.2
    with _serving(model, workers=3, queue=1, timeout=timeout, deadline=deadline) as srv:
        address = srv.server_address[:2]
        idle = [socket.create_connection(address, timeout=10) for _ in range(6)]  # more than the workers
        opened = time.monotonic()
        slow_headers = b"POST /caption HTTP/1.1\r\nX-Filename: slow.png\r\nX-Pad: " + b"a" * 200
        slow_body = b"POST /caption HTTP/1.1\r\nContent-Length: 1000\r\nX-Filename: slow.png\r\n\r\n"
        trickled: dict[str, tuple[float, int, bytes]] = {}
        tricklers = [threading.Thread(target=lambda k=k, head=head, drip=drip: trickled.update(
            {k: _trickle(address, head, drip, every)})) for k, head, drip in (
            ("headers", b"", slow_headers), ("body", slow_body, b"\0" * 1000))]
        for t in tricklers:
            t.start()
        held = time.monotonic() + 5
        while (len(srv.idle), srv.open_connections) != (6, 8) and time.monotonic() < held:
            time.sleep(0.01)  # until both tricklers have left the idle ones for a worker: one of the three is left
        assert (len(srv.idle), srv.open_connections) == (6, 8)
        status, answer = _post(srv, images[0].read_bytes(), "meanwhile.png")
        assert status == 200 and answer["caption"] == _api(model, images[0]).caption
        assert time.monotonic() - opened < timeout and select.select(idle, [], [], 0)[0] == []  # none dropped yet
        for sock in idle:
            assert _until_closed(sock) == b""  # closed without an answer...
            assert timeout - 0.05 <= time.monotonic() - opened < timeout + 4  # ...once silent for the time-out
            sock.close()
        for t in tricklers:
            t.join(15)
    took, sent, answer = trickled["headers"]
    assert answer == b"" and deadline - 0.05 <= took < deadline + 4  # dropped at the deadline...
    assert sent >= 10  # ...not by the time-out: it had sent a byte every 0.2 s
    took, sent, answer = trickled["body"]
    assert deadline - 0.05 <= took < deadline + 4 and sent - len(slow_body) >= 10
    assert answer.startswith(b"HTTP/1.0 400 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "the upload stopped before its end: the request "
                                                           f"did not arrive within {deadline:g} s (--deadline)"}


def test_a_burst_over_the_upload_queue_gets_503_with_retry_after_and_the_rest_their_captions(model, images):
    burst = [images[i % len(images)] for i in range(6)]
    answers: list[tuple[Path, tuple[int, dict, dict]]] = []
    with _serving(model, workers=4, queue=1, timeout=10, deadline=10) as srv:
        srv.decoding.acquire()  # the model stays busy: 1 upload decodes, 1 waits (--queue 1), the other 4 are refused
        try:
            threads = [threading.Thread(target=lambda p=p: answers.append((p, _upload(srv, p.read_bytes(), p.name))))
                       for p in burst]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while len(answers) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            refused = list(answers)
            with urllib.request.urlopen(srv.url, timeout=10) as page:  # a free worker answers the page meanwhile
                assert page.status == 200
        finally:
            srv.decoding.release()
        for t in threads:
            t.join(30)
    assert len(refused) == 4 and len(answers) == 6
    for _, (status, headers, answer) in refused:
        assert status == 503 and headers["Retry-After"] == "1"  # nothing decoded yet: the shortest wait
        assert answer == {"error": "the server is busy: every place in the model's queue is taken (--queue 1); "
                          "try again in 1 s"}
    captioned = [(p, a) for p, (status, _, a) in answers if status == 200]
    assert len(captioned) == 2 and all(a["caption"] == _api(model, p).caption for p, a in captioned)


def test_connections_over_the_cap_are_refused_at_once(model, images):
    with _serving(model, workers=2, queue=0, max_connections=3, timeout=10, deadline=10) as srv:
        address = srv.server_address[:2]
        held = [socket.create_connection(address, timeout=10) for _ in range(3)]
        deadline = time.monotonic() + 10
        while srv.open_connections < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.create_connection(address, timeout=10) as extra:
            start = time.monotonic()
            answer = _until_closed(extra)
            assert time.monotonic() - start < 2  # at once, not when a held one is dropped (10 s)
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.0 503 ") and b"\r\nRetry-After: 1\r\n" in head
        assert json.loads(body) == {"error": "the server is busy: it has as many connections open as it takes "
                                    "(--max-connections 3); try again in 1 s"}
        for sock in held:
            sock.close()
        while srv.open_connections and time.monotonic() < deadline:  # the server sees them close
            time.sleep(0.02)
        assert srv.open_connections == 0 and _post(srv, images[0].read_bytes(), "after.png")[0] == 200


@pytest.mark.integration
def test_the_help_imports_no_torch():
    script = ("import contextlib, io, sys\nfrom captioning.tools.demo import main\n"
              "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
              "    main(['--help'])\n"
              "print('--max-connections' in out.getvalue(), sorted({m.split('.')[0] for m in sys.modules} & "
              "{'torch', 'torchvision', 'matplotlib'}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["True", "[]"], done.stderr


# -- the command line -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "missing.pt"], "checkpoint not found: missing.pt"),
    (["--checkpoint", "x.pt", "--port", "70000"], "expected a port number 0..65535"),
    (["--checkpoint", "x.pt", "--beam-size", "0"], "must be >= 1"),
    (["--checkpoint", "x.pt", "--alternatives", "-1"], "expected a whole number >= 0"),
    (["--checkpoint", "x.pt", "--workers", "0"], "argument --workers: must be >= 1"),
    (["--checkpoint", "x.pt", "--max-connections", "none"], "argument --max-connections: expected a whole number"),
    (["--checkpoint", "x.pt", "--timeout", "0"], "argument --timeout: expected a number of seconds > 0, got '0'"),
    (["--checkpoint", "x.pt", "--deadline", "inf"], "argument --deadline: expected a number of seconds > 0"),
    (["--checkpoint", "x.pt", "--queue", "-2"], "argument --queue: expected a whole number >= 0"),
    (["--checkpoint", "x.pt", "--workers", "4", "--queue", "3"], "--workers 4 is too few for --queue 3: "),
])
def test_a_bad_option_or_checkpoint_is_one_error_line(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("captioning-demo: error: ") and message in err
    assert err.count("\n") == 1


def test_a_busy_port_is_one_error_line(checkpoint, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit) as exc:
            main(["--checkpoint", str(checkpoint), "--port", str(busy.getsockname()[1]), "--device", "cpu"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cannot serve on 127.0.0.1:" in err and err.count("\n") == 1


@pytest.mark.integration
def test_the_command_prints_its_url_serves_and_stops_on_ctrl_c(checkpoint):
    proc = subprocess.Popen([sys.executable, "-m", "captioning.tools.demo", "--checkpoint", str(checkpoint),
                             "--port", "0", "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"on (http://127\.0\.0\.1:\d+/) ", line).group(1)
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
        time.sleep(0.2)  # the request's log line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == "captioning-demo: stopped", (out, err)
    assert '"GET / HTTP/1.1" 200' in err and "Traceback" not in err


# -- in a real headless browser -------------------------------------------------------------------------------------
@pytest.fixture
def page(browser, server):
    browser.get(server.url)
    browser.get_log("browser")  # start each test with an empty console log
    return browser


# The heatmap canvas: its size, the range of its veil's opacity, a checksum of its pixels and the word it shows.
_READ_CANVAS = """
const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let lo = 256, hi = -1, sum = 0;
for (let i = 3; i < d.length; i += 4) { lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]); sum = (sum * 31 + d[i]) % 1e9; }
return {w: c.width, h: c.height, lo: lo, hi: hi, sum: sum, word: c.dataset.word};
"""


def _wait(page, condition, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(page, timeout).until(lambda d: condition(d))


def _caption_shown(page) -> str:
    from selenium.webdriver.common.by import By

    _wait(page, lambda d: d.find_element(By.ID, "result").is_displayed() and not d.find_element(By.ID, "status").text)
    return page.find_element(By.ID, "caption").text


@pytest.mark.integration
def test_uploading_shows_the_caption_and_each_words_heatmap_on_hover(page, model, images):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    expected = _api(model, images[0])
    page.find_element(By.ID, "file").send_keys(str(images[0]))
    assert _caption_shown(page) == expected.caption
    alternatives = page.find_elements(By.CSS_SELECTOR, "#alternatives li")
    assert [li.text for li in alternatives] == [f"{a.caption} (log p {a.log_prob:.3f})" for a in expected.alternatives]
    assert page.find_element(By.ID, "score").text == f"log-probability {expected.log_prob:.3f}"
    canvas = page.find_element(By.CSS_SELECTOR, "canvas.heat")
    assert page.execute_script(_READ_CANVAS, canvas)["hi"] <= 0  # nothing drawn before a hover
    sums = set()
    for t, word in enumerate(page.find_elements(By.CSS_SELECTOR, "#caption .word")):
        ActionChains(page).move_to_element(word).perform()
        state = page.execute_script(_READ_CANVAS, canvas)
        assert state["word"] == str(t) and "active" in word.get_attribute("class")
        assert state["w"] == state["h"] == DISPLAY_SIDE  # the map covers the whole image
        assert state["lo"] <= 5 and state["hi"] >= 150  # the most attended cell clear, the least veiled
        assert page.find_element(By.CSS_SELECTOR, ".shown").text == f"attention: {expected.words[t]}"
        sums.add(state["sum"])
    assert len(sums) == len({m.tobytes() for m in quantize_maps(expected.attention)})  # each word its own map
    ActionChains(page).move_to_element(page.find_element(By.TAG_NAME, "h1")).perform()
    assert page.execute_script(_READ_CANVAS, canvas)["hi"] == 0  # back to the plain image
    assert [e for e in page.get_log("browser") if e["level"] in ("SEVERE", "ERROR")] == []


@pytest.mark.integration
def test_a_dropped_image_is_captioned(page, model, images):
    data = base64.b64encode(images[1].read_bytes()).decode()
    page.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[0]), function (c) { return c.charCodeAt(0); });
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], "dropped.png", {type: "image/png"}));
        document.body.dispatchEvent(new DragEvent("drop", {dataTransfer: transfer, bubbles: true, cancelable: true}));
    """, data)
    assert _caption_shown(page) == _api(model, images[1]).caption


@pytest.mark.integration
def test_a_bad_or_too_large_file_shows_its_message_on_the_page(page, images, tmp_path):
    from selenium.webdriver.common.by import By

    (tmp_path / "bad.png").write_bytes(b"this is not a PNG")
    (tmp_path / "big.png").write_bytes(b"\0" * (LIMIT + 1))
    error = page.find_element(By.ID, "error")
    for name, message in (("bad.png", "cannot read image bad.png: cannot identify image file"),
                          ("big.png", "the file is 0.1 MB, over the upload limit of 0.0625 MB")):
        page.find_element(By.ID, "file").send_keys(str(images[0]))
        assert _caption_shown(page) and not error.is_displayed()
        page.find_element(By.ID, "file").send_keys(str(tmp_path / name))
        _wait(page, lambda d, m=message: error.is_displayed() and error.text.startswith(m))
        assert not page.find_element(By.ID, "result").is_displayed()  # no earlier caption left beside the message
