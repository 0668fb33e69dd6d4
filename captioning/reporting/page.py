"""The markup of the HTML report page (captioning/reporting/html.py prepares what goes in it).

The page is one static template, its CSS and the inline script that draws a word's attention map over the image and
sorts the table, filled by `render_page` with the rows, the overall metrics, the training curves image and the
attention data (a JSON block). Text is HTML-escaped here; nothing is fetched from outside the file.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from string import Template
from typing import Any

from captioning.metrics.diversity import collapse_note
from captioning.reporting.items import ReportItem
from captioning.reporting.numbers import format_metric

THUMB_SIDE = 224  # longer side of the embedded thumbnails, in pixels


def _sort_key(value: Any) -> str:
    """A cell's full-precision value for sorting ("" when missing or not a number)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return repr(value) if ok else ""


# The attention drawing report.html and the demo page (captioning/inference/demo_page.py) share:
# drawAttention(canvas, base, e, t) draws word t's map of an entry {h, w, maps: base64 uint8 (T, h, w), regions?} on
# the canvas laid over the image `base`, as described below (t === null clears it).
HEATMAP_JS = """
  const STRENGTH = 0.7;

  function maps(e) {
    if (!e.bytes) {
      const s = atob(e.maps);
      e.bytes = new Uint8Array(s.length);
      for (let i = 0; i < s.length; i++) e.bytes[i] = s.charCodeAt(i);
    }
    return e.bytes;
  }

  function drawAttention(canvas, base, e, t) {
    const W = base.naturalWidth || base.offsetWidth, H = base.naturalHeight || base.offsetHeight;
    if (canvas.width !== W || canvas.height !== H) { canvas.width = W; canvas.height = H; }
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, W, H);
    canvas.dataset.word = t === null || !e ? "" : String(t);
    if (t === null || !e) return;
    const n = e.h * e.w, bytes = maps(e);
    const small = document.createElement("canvas");
    small.width = e.w; small.height = e.h;
    const sctx = small.getContext("2d");
    const veil = sctx.createImageData(e.w, e.h);
    for (let i = 0; i < n; i++) veil.data[4 * i + 3] = Math.round(255 * STRENGTH * (1 - bytes[t * n + i] / 255));
    sctx.putImageData(veil, 0, 0);
    ctx.imageSmoothingEnabled = true;
    ctx.drawImage(small, 0, 0, W, H);
    if (e.regions) {
      const r = e.regions[t], cw = W / e.w, ch = H / e.h;
      ctx.strokeStyle = "red"; ctx.lineWidth = 2;
      ctx.strokeRect((r % e.w) * cw + 1, Math.floor(r / e.w) * ch + 1, cw - 2, ch - 2);
    }
  }
"""


# The page: CSS, the table, the attention data (JSON) and the script that draws maps and sorts rows. A word's map is
# drawn as a black veil of opacity STRENGTH * (1 - m) over the image, which is visualize.overlay_attention's blend
# (pixel * (1 - strength + strength * m)); the browser's bilinear upscaling of the h x w veil does the smoothing.
# Nothing is wider than the window: the curves image (420 px a panel, 1260 px for three) shrinks to the page's
# width, and long overall values (a results path) wrap.
PAGE_TEMPLATE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<link rel="icon" href="data:,"><title>$title</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
#curves img { max-width: 100%; height: auto; }
p.collapse { color: #a40000; font-weight: 600; }
table.overall th { text-align: left; padding-right: 1em; font-weight: 600; }
table.overall td { overflow-wrap: anywhere; }
#images { border-collapse: collapse; margin-top: 1em; }
#images th, #images td { border-bottom: 1px solid #ddd; padding: 6px 8px; vertical-align: top; }
#images th.sortable { cursor: pointer; user-select: none; white-space: nowrap; }
#images th[aria-sort=ascending]::after { content: " \\25B2"; }
#images th[aria-sort=descending]::after { content: " \\25BC"; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.view { position: relative; display: inline-block; line-height: 0; }
.view canvas.heat { position: absolute; left: 0; top: 0; width: 100%; height: 100%; pointer-events: none; }
.noimage { background: #999; color: #fff; line-height: 1.4; padding: 4px; box-sizing: border-box; }
.shown { font-size: 12px; color: #666; }
.word { cursor: pointer; padding: 0 1px; border-radius: 3px; }
.word:hover, .word.active { background: #ffe08a; }
tr.pinned .word.active { outline: 2px solid #d08000; }
.beta { color: #777; font-size: 70%; margin-left: 1px; }
.word.hallucinated { color: #a40000; text-decoration: underline wavy #a40000; }
ol.refs { margin: 0; padding-left: 1.4em; color: #555; }
</style></head>
<body>
<h1>$title</h1>
<section id="overall"><h2>Overall metrics</h2>$overall</section>
$curves
<h2>Images (<span id="count">$count</span>)</h2>
$capped
<p class="hint">Hover over a word to see where the model looked while generating it (white = attended; a red box
marks the region hard attention selected); click a word to keep its map. Click a column header to sort.</p>
<table id="images"><thead><tr>$head</tr></thead><tbody>$body</tbody></table>
<script type="application/json" id="report-data">$data</script>
<script>
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const table = document.getElementById("images");
  const tbody = table.tBodies[0];
  const pinned = new Map();
$heatmap_js
  // Draw word t's attention over the row's image (t === null: the plain image).
  function draw(row, t) {
    const e = data.entries[Number(row.dataset.entry)];
    const canvas = row.querySelector("canvas.heat");
    if (!e || !canvas) return;
    drawAttention(canvas, canvas.previousElementSibling, e, t);
    row.querySelectorAll(".word.active").forEach(function (el) { el.classList.remove("active"); });
    const label = row.querySelector(".shown");
    if (t === null) { label.textContent = "image"; return; }
    const word = row.querySelector('.word[data-t="' + t + '"]');
    word.classList.add("active");
    label.textContent = "attention: " + word.textContent;
  }

  function restore(row) { draw(row, pinned.has(row) ? pinned.get(row) : null); }
  function wordOf(ev) { return ev.target.closest ? ev.target.closest(".word") : null; }
  function show(ev) { const w = wordOf(ev); if (w) draw(w.closest("tr"), Number(w.dataset.t)); }
  function hide(ev) { const w = wordOf(ev); if (w) restore(w.closest("tr")); }
  function pin(ev) {
    const w = wordOf(ev);
    if (!w || (ev.type === "keydown" && ev.key !== "Enter" && ev.key !== " ")) return;
    const row = w.closest("tr"), t = Number(w.dataset.t);
    if (pinned.get(row) === t) pinned.delete(row); else pinned.set(row, t);
    row.classList.toggle("pinned", pinned.has(row));
    draw(row, t);
    if (ev.type === "keydown") ev.preventDefault();
  }
  tbody.addEventListener("mouseover", show);
  tbody.addEventListener("focusin", show);
  tbody.addEventListener("mouseout", hide);
  tbody.addEventListener("focusout", hide);
  tbody.addEventListener("click", pin);
  tbody.addEventListener("keydown", pin);

  // Sort by a column: first click ascending, then descending; empty values last, ties in report order.
  function value(row, col) {
    const v = row.cells[col].dataset.value;
    return v === "" ? NaN : Number(v);
  }
  table.tHead.addEventListener("click", function (ev) {
    const th = ev.target.closest("th.sortable");
    if (!th) return;
    const col = Number(th.dataset.col);
    const dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
    table.tHead.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir);
    const sign = dir === "ascending" ? 1 : -1;
    const rows = Array.from(tbody.rows);
    rows.sort(function (a, b) {
      const x = value(a, col), y = value(b, col);
      if (isNaN(x) || isNaN(y)) return (isNaN(x) - isNaN(y)) || (a.dataset.entry - b.dataset.entry);
      return sign * (x - y) || (a.dataset.entry - b.dataset.entry);
    });
    rows.forEach(function (r) { tbody.appendChild(r); });
  });
})();
</script>
</body></html>
""")


def _overall_table(metrics: Mapping[str, Any]) -> str:
    rows = []
    for k, v in metrics.items():
        rows.append(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(format_metric(str(k), v))}</td></tr>")
    return '<table class="overall">' + "".join(rows) + "</table>"


HALLUCINATED_TITLE = ' title="CHAIR: names an object that is not in the image"'


def hallucinated_positions(words: Sequence[str], hallucinated: object) -> set[int]:
    """The positions of `words` that make up the hallucinated mentions (CHAIR's `hallucinated`, phrases as
    written), each mention matched to its own first occurrence left to right; nothing for anything else."""
    if not isinstance(hallucinated, list):
        return set()
    out: set[int] = set()
    start = 0
    for phrase in hallucinated:
        parts = str(phrase).split()
        for k in range(start, len(words) - len(parts) + 1):
            if list(words[k: k + len(parts)]) == parts:
                out.update(range(k, k + len(parts)))
                start = k + len(parts)
                break
    return out


def _row(n: int, item: ReportItem, columns: Sequence[str]) -> str:
    beta = [""] * len(item.words) if item.sentinel is None else [
        f'<sub class="beta" title="visual sentinel weight: the share of this word not taken from the image">'
        f'\u03b2 {b:.2f}</sub>' for b in item.sentinel]
    wrong = hallucinated_positions(item.words, item.scores.get("hallucinated"))
    words = " ".join(f'<span class="word{" hallucinated" if t in wrong else ""}" data-t="{t}" tabindex="0"'
                     f'{HALLUCINATED_TITLE if t in wrong else ""}>{html.escape(wd)}</span>{beta[t]}'
                     for t, wd in enumerate(item.words)) or '<span class="empty">(empty caption)</span>'
    if item.image_uri is not None:
        view = f'<img class="thumb" src="{item.image_uri}" alt="image {item.image_id}">'
    else:  # a grey box with the grid's aspect ratio, so the attention maps still show
        h, w = item.alphas.shape[1:] if item.alphas is not None else (1, 1)
        size = f"width:{round(THUMB_SIDE * min(1, w / h))}px;height:{round(THUMB_SIDE * min(1, h / w))}px"
        view = f'<div class="noimage" style="{size}">image {item.image_id} not available</div>'
    if item.alphas is not None:
        view += '<canvas class="heat" data-word=""></canvas>'
    refs = "".join(f"<li>{html.escape(r)}</li>" for r in item.references)
    cells = "".join(f'<td class="num" data-value="{_sort_key(item.scores.get(c))}">'
                    f'{html.escape(format_metric(c, item.scores.get(c)))}</td>'
                    for c in columns)
    return (f'<tr class="entry" data-entry="{n}" data-image-id="{item.image_id}">'
            f'<td class="num" data-value="{n + 1}">{n + 1}</td>'
            f'<td class="num" data-value="{item.image_id}">{item.image_id}</td>'
            f'<td><div class="view">{view}</div><div class="shown">image</div></td>'
            f'<td class="caption">{words}</td><td><ol class="refs">{refs}</ol></td>{cells}</tr>')


def capped_note(shown: int, total: int) -> str:
    """What a page that left rows out says about it (and the warning line of the command that wrote it)."""
    return (f"showing {shown} of {total} images: the first {shown} in result order ({total - shown} left out); "
            f"captioning-html --max-entries 0 (or a larger number) writes a page with them all")


def render_page(items: Sequence[ReportItem], columns: Sequence[str], metrics: Mapping[str, Any], title: str,
                curves_uri: str | None, data: str, total: int | None = None) -> str:
    """The page: a row per item with its `columns` scores, the overall metrics, the curves image (a data URI) and
    the attention data (JSON text); `total` rows there were, when a cap kept only these `items`."""
    # Column i of the header is cell i of every row; the numeric ones sort.
    names = ["#", "image id", "image", "caption", "references", *columns]
    head = "".join(f'<th class="sortable" data-col="{i}">{html.escape(n)}</th>' if i < 2 or i >= 5
                   else f"<th>{n}</th>" for i, n in enumerate(names))
    body = "".join(_row(n, it, columns) for n, it in enumerate(items))
    curves_html = (f'<section id="curves"><h2>Training curves</h2><img src="{curves_uri}" '
                   f'alt="training curves"></section>') if curves_uri is not None else ""
    note = capped_note(len(items), total) if total is not None and total > len(items) else ""
    capped = f'<p class="capped">{html.escape(note[:1].upper() + note[1:])}.</p>' if note else ""
    collapsed = metrics.get("collapsed_caption")
    if isinstance(collapsed, str):  # score_predictions found one caption for most images: said above the table
        line = collapse_note(collapsed, float(metrics.get("top_caption_share", 0.0)), int(metrics.get("num_images", 0)))
        capped = f'<p class="collapse">{html.escape(line[:1].upper() + line[1:])}.</p>' + capped
    return PAGE_TEMPLATE.substitute(
        title=html.escape(title), overall=_overall_table(metrics), curves=curves_html, head=head, body=body,
        count=len(items), capped=capped, heatmap_js=HEATMAP_JS,
        data=data.replace("</", "<\\/"))  # no "</script>" can close the data block early
