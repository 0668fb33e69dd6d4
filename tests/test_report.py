"""captioning-report: a sweep folder becomes one table; failed runs are listed, not fatal."""

import json

import pytest

from captioning.report import collect_runs, main, table_rows, to_markdown


def _run(root, num, overrides, metrics=None):
    run = root / str(num)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_table_has_overrides_and_metrics(tmp_path, capsys):
    _run(tmp_path, 0, ["attention=soft"], {"Bleu_4": 0.51234, "CIDEr": 1.5, "attention": "soft"})
    _run(tmp_path, 1, ["attention=hard"], {"Bleu_4": 0.47, "CIDEr": 1.2, "attention": "hard"})
    _run(tmp_path, 2, ["attention=dot"])  # crashed before writing metrics
    runs = collect_runs(tmp_path)
    assert [r.finished for r in runs] == [True, True, False]
    header, rows = table_rows(runs, ["Bleu_4", "CIDEr"])
    assert header == ["attention", "Bleu_4", "CIDEr", "run"]
    assert rows[0][:3] == ["soft", "0.5123", "1.5"] and rows[1][:3] == ["hard", "0.47", "1.2"]
    assert rows[2][:2] == ["dot", "failed/unfinished"]
    assert to_markdown(header, rows).count("\n") == 5
    main([str(tmp_path), "--metrics", "Bleu_4,CIDEr", "--out", str(tmp_path / "table.md")])
    out = capsys.readouterr().out
    assert "| soft | 0.5123 | 1.5 |" in out and "1 of 3 runs have no metrics.json" in out
    assert (tmp_path / "table.csv").read_text().splitlines()[0] == "attention,Bleu_4,CIDEr,run"


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        collect_runs(tmp_path / "missing")
    with pytest.raises(ValueError, match="no Hydra runs"):
        collect_runs(tmp_path)
