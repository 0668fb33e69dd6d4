"""The page of `captioning-demo` (captioning/tools/demo.py serves it) and the JSON answer for one captioned image.

The page is one self-contained document (inline CSS and script; its Content-Security-Policy allows no other
source): a file input, and drag-and-drop onto the whole page. The chosen image is POSTed as the raw request body to
`caption`, and the answer (`result_payload`) shows the caption, its log-probability and the beam's alternatives.
Hovering (or focusing) a word draws its attention map over the image as report.html does (page.py's HEATMAP_JS):
the maps travel quantized to uint8 (`quantize_maps`), the image as the encoder saw it (`image_data_uri`),
and each map is drawn as a black veil of opacity STRENGTH * (1 - m), upscaled bilinearly by the browser.
"""

from __future__ import annotations

import base64
import html
import json
from string import Template
from typing import TYPE_CHECKING, Any

from captioning.reporting.page import HEATMAP_JS

if TYPE_CHECKING:
    from captioning.inference.model import CaptionResult

DISPLAY_SIDE = 448  # longer side of the image on the page (the encoder's view is often 224 px or less)
MB = 2**20
# The one wording of an over-limit upload: the server's 413 and the page's check before sending.
TOO_LARGE = ("the file is {size} MB, over the upload limit of {limit} MB "
             "(start captioning-demo with a larger --max-upload-mb)")


def too_large_message(size_bytes: int, limit_bytes: int) -> str:
    """The message for an upload of size_bytes over a limit of limit_bytes."""
    return TOO_LARGE.format(size=f"{size_bytes / MB:.1f}", limit=f"{limit_bytes / MB:g}")


def result_payload(result: CaptionResult) -> dict[str, Any]:
    """The JSON answer for one image: caption, words, log-probability, alternatives, the view and its word maps."""
    from captioning.reporting.html import image_data_uri, quantize_maps  # here: reporting.html imports torch

    _, h, w = result.attention.shape  # (T, h, w)
    return {
        "caption": result.caption, "words": list(result.words), "log_prob": round(result.log_prob, 4),
        "alternatives": [{"caption": a.caption, "log_prob": round(a.log_prob, 4)} for a in result.alternatives],
        "image": image_data_uri(result.image, DISPLAY_SIDE), "h": int(h), "w": int(w),
        "maps": base64.b64encode(quantize_maps(result.attention).tobytes()).decode("ascii"),  # T * h * w bytes
        "regions": result.regions,  # hard attention: the cell each word picks (outlined in red), else null
    }


def render_demo_page(max_upload_bytes: int, beam_size: int, alternatives: int, max_len: int,
                     title: str = "Show, Attend and Tell: caption an image") -> str:
    """The demo page as one HTML string (nothing in it is fetched from elsewhere)."""
    config = {"max_bytes": max_upload_bytes, "too_large": TOO_LARGE, "limit": f"{max_upload_bytes / MB:g}"}
    settings = (f"beam size {beam_size}, {alternatives} alternatives, at most {max_len} words; "
                f"images up to {max_upload_bytes / MB:g} MB")
    return PAGE.substitute(title=html.escape(title), settings=html.escape(settings), heatmap_js=HEATMAP_JS,
                           config=json.dumps(config).replace("</", "<\\/"))


PAGE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; connect-src 'self';
 style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<link rel="icon" href="data:,"><title>$title</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; min-height: 90vh; }
body.dragging { outline: 4px dashed #d08000; outline-offset: -8px; }
#drop { border: 2px dashed #aaa; border-radius: 8px; padding: 1em; max-width: 40em; }
.settings, .shown, #status { color: #666; font-size: 13px; }
#error { color: #a00000; font-weight: 600; }
.view { position: relative; display: inline-block; line-height: 0; margin-top: 1em; }
.view canvas.heat { position: absolute; left: 0; top: 0; width: 100%; height: 100%; pointer-events: none; }
#caption { font-size: 20px; margin: 0.4em 0 0.1em; }
.word { cursor: pointer; padding: 0 2px; border-radius: 3px; }
.word:hover, .word.active { background: #ffe08a; }
.word.pinned { outline: 2px solid #d08000; }
#alternatives .score, #score { color: #555; font-variant-numeric: tabular-nums; }
</style></head>
<body>
<h1>$title</h1>
<div id="drop"><label>Drop an image anywhere on this page, or choose one:
<input type="file" id="file" accept="image/*"></label>
<div class="settings">$settings</div></div>
<p id="status" role="status"></p>
<p id="error" role="alert" hidden></p>
<section id="result" hidden>
<div class="view"><img id="photo" alt="the image as the model saw it"><canvas class="heat" data-word=""></canvas></div>
<div class="shown">image</div>
<p id="caption"></p>
<p id="score"></p>
<p class="hint">Hover over a word to see where the model looked while generating it (white = attended; a red box
marks the region hard attention selected); click a word to keep its map.</p>
<h2>The beam's alternatives</h2>
<ol id="alternatives"></ol>
</section>
<script type="application/json" id="demo-config">$config</script>
<script>
"use strict";
(function () {
  const config = JSON.parse(document.getElementById("demo-config").textContent);
  const el = function (id) { return document.getElementById(id); };
  const canvas = document.querySelector("canvas.heat"), photo = el("photo"), words = el("caption");
  let entry = null, pinned = null, latest = 0;
$heatmap_js
  // Word t's attention over the image (t === null: the plain image), the word marked and named under the image.
  function draw(t) {
    drawAttention(canvas, photo, entry, t);
    words.querySelectorAll(".word.active").forEach(function (w) { w.classList.remove("active"); });
    const label = el("result").querySelector(".shown");
    if (t === null || !entry) { label.textContent = "image"; return; }
    const word = words.querySelector('.word[data-t="' + t + '"]');
    word.classList.add("active");
    label.textContent = "attention: " + word.textContent;
  }

  function wordOf(ev) { return ev.target.closest ? ev.target.closest(".word") : null; }
  function show(ev) { const w = wordOf(ev); if (w) draw(Number(w.dataset.t)); }
  function hide(ev) { if (wordOf(ev)) draw(pinned); }
  function pin(ev) {
    const w = wordOf(ev);
    if (!w || (ev.type === "keydown" && ev.key !== "Enter" && ev.key !== " ")) return;
    const t = Number(w.dataset.t);
    pinned = pinned === t ? null : t;
    words.querySelectorAll(".word.pinned").forEach(function (x) { x.classList.remove("pinned"); });
    if (pinned !== null) w.classList.add("pinned");
    draw(t);
    if (ev.type === "keydown") ev.preventDefault();
  }
  ["mouseover", "focusin"].forEach(function (k) { words.addEventListener(k, show); });
  ["mouseout", "focusout"].forEach(function (k) { words.addEventListener(k, hide); });
  ["click", "keydown"].forEach(function (k) { words.addEventListener(k, pin); });

  function fail(text) {
    el("status").textContent = "";
    el("result").hidden = true;
    el("error").textContent = text;
    el("error").hidden = false;
  }

  function render(res) {
    entry = res; pinned = null;
    words.textContent = "";
    res.words.forEach(function (w, t) {
      const span = document.createElement("span");
      span.className = "word"; span.dataset.t = String(t); span.tabIndex = 0; span.textContent = w;
      if (t) words.appendChild(document.createTextNode(" "));
      words.appendChild(span);
    });
    if (!res.words.length) words.textContent = "(empty caption)";
    el("score").textContent = "log-probability " + res.log_prob.toFixed(3);
    const list = el("alternatives");
    list.textContent = "";
    res.alternatives.forEach(function (a) {
      const li = document.createElement("li"), score = document.createElement("span");
      score.className = "score"; score.textContent = " (log p " + a.log_prob.toFixed(3) + ")";
      li.textContent = a.caption || "(empty caption)";
      li.appendChild(score);
      list.appendChild(li);
    });
    photo.onload = function () { draw(null); };
    photo.src = res.image;
    el("status").textContent = "";
    el("result").hidden = false;
  }

  async function upload(file) {
    if (!file) return;
    const id = ++latest;
    el("error").hidden = true;
    if (file.size > config.max_bytes) {
      fail(config.too_large.replace("{size}", (file.size / 1048576).toFixed(1)).replace("{limit}", config.limit));
      return;
    }
    el("status").textContent = "captioning " + file.name + "\\u2026";
    let res, text;
    try {
      res = await fetch("caption", {method: "POST", body: file, headers: {
        "Content-Type": "application/octet-stream", "X-Filename": encodeURIComponent(file.name)}});
      text = await res.text();
    } catch (err) {
      if (id === latest) fail("the upload failed (" + err.message + "): is captioning-demo still running?");
      return;
    }
    if (id !== latest) return;  // a newer upload replaced this one
    let body = null;
    try { body = JSON.parse(text); } catch (err) { body = null; }
    if (!res.ok || !body || body.error) fail((body && body.error) || ("the server answered " + res.status));
    else render(body);
  }

  el("file").addEventListener("change", function (ev) { upload(ev.target.files[0]); ev.target.value = ""; });
  document.addEventListener("dragover", function (ev) {
    ev.preventDefault();
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", function () { document.body.classList.remove("dragging"); });
  document.addEventListener("drop", function (ev) {
    ev.preventDefault();
    document.body.classList.remove("dragging");
    if (ev.dataTransfer && ev.dataTransfer.files.length) upload(ev.dataTransfer.files[0]);
  });
})();
</script>
</body></html>
""")
