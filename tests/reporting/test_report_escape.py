"""captioning-report on a stranger's sweep: override and metric values reach the CSV and Markdown tables as text,
never as a spreadsheet formula, a broken table or raw HTML (issue 29, item 7)."""

from __future__ import annotations

import csv
import json

import pytest

from captioning.reporting.sweep import csv_cell, markdown_cell
from captioning.tools.report import main

FORMULA = '=HYPERLINK("http://x","y")'
HTML = "<img src=x onerror=alert(1)>"
PIPE_AND_LINES = "a|b\\|c\nd\re"
VALUES = [FORMULA, HTML, PIPE_AND_LINES, "@SUM(A1)", "+cmd", "-2+3", "\tx", "`code` & <b>", "-0.5"]


def _sweep(root):
    """One run per crafted value of `evil` (plus an override key that is itself a formula), each finished."""
    for n, value in enumerate(VALUES):
        run = root / str(n)
        (run / ".hydra").mkdir(parents=True)
        overrides = [f"evil={value}", f"@SUM(1+1)=k{n}", f"optim.lr=0.00{n + 1}"]
        (run / ".hydra" / "overrides.yaml").write_text(json.dumps(overrides))  # JSON is YAML: any characters
        (run / "metrics.json").write_text(json.dumps({"CIDEr": -0.25 * n, "note": "=cmd|' /C calc'!A0"}))


def _gfm_cells(line: str) -> list[str]:
    """A Markdown table row split as GitHub does: at every `|` not escaped by a backslash (`\\\\` is one)."""
    cells, cell, chars = [], "", iter(line.strip()[1:-1])
    for ch in chars:
        if ch == "\\":
            cell += ch + next(chars, "")
        elif ch == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += ch
    return [*cells, cell]


def test_csv_has_no_live_formula_and_keeps_numbers(tmp_path, capsys):
    _sweep(tmp_path / "sweep")
    assert main([str(tmp_path / "sweep"), "--metrics", "CIDEr,note", "--out", str(tmp_path / "t.md")]) == 0
    with (tmp_path / "t.csv").open(newline="") as f:  # as a spreadsheet reads it: a quoted \r stays a \r
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert header == ["'@SUM(1+1)", "evil", "optim.lr", "CIDEr", "note", "run"]
    assert len(body) == len(VALUES) and all(len(row) == len(header) for row in body)
    cells = [cell for row in rows for cell in row]
    assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r")]
    assert not [c for c in cells if c.startswith("-") and not c.lstrip("-").replace(".", "").isdigit()]
    evil = [row[1] for row in body]
    assert evil == ["'" + v if v[0] in "=+-@\t" and v != "-0.5" else v for v in VALUES]  # the text itself, behind a '
    assert evil[-1] == "-0.5" and [row[3] for row in body][1] == "-0.2500"  # numbers stay numbers
    assert {row[4] for row in body} == {"'=cmd|' /C calc'!A0"}  # a metric's text value too
    capsys.readouterr()


def test_markdown_table_keeps_its_columns_and_holds_no_html(tmp_path, capsys):
    _sweep(tmp_path / "sweep")
    main([str(tmp_path / "sweep"), "--metrics", "CIDEr,note", "--out", str(tmp_path / "t.md")])
    markdown = (tmp_path / "t.md").read_text()
    lines = markdown.splitlines()
    assert len(lines) == 2 + len(VALUES)  # header, rule, one line per run: no value broke a row
    assert {len(_gfm_cells(line)) for line in lines} == {6}
    assert "<img" not in markdown and "<b>" not in markdown and "`" not in markdown
    evil = [_gfm_cells(line)[1].strip() for line in lines[2:]]
    assert evil[0] == FORMULA and evil[1] == "&lt;img src=x onerror=alert(1)&gt;"
    assert evil[2] == "a\\|b\\\\\\|c d e"  # renders as a|b\|c d e
    assert evil[7] == "&#96;code&#96; &amp; &lt;b&gt;"
    assert capsys.readouterr().out.startswith(lines[0])  # the printed table is the file's


@pytest.mark.parametrize("text,cell", [("-0.5", "-0.5"), ("+1e-3", "+1e-3"), ("0.5", "0.5"), ("-inf", "'-inf"),
                                       ("-", "'-"), ("\r=1", "'\r=1"), ("a=b", "a=b"), ("", "")])
def test_csv_cell(text, cell):
    assert csv_cell(text) == cell


def test_markdown_cell_is_one_line_without_markup():
    assert markdown_cell("x\r\ny\u2028z\x1b[31m") == "x y z [31m"
    assert markdown_cell("plain_name.value-1") == "plain_name.value-1"
