"""captioning-report: a sweep folder becomes one table; failed runs are listed, not fatal."""

import csv
import io
import json

import pytest
from matplotlib.image import imread

from captioning.reporting.sweep import collect_runs, plot_sweep, sweep_series, swept_params, table_rows, to_markdown
from captioning.tools.report import main


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
    assert rows[0][:3] == ["soft", "0.5123", "1.5000"] and rows[1][:3] == ["hard", "0.4700", "1.2000"]
    assert rows[2][:2] == ["dot", "failed/unfinished"]
    assert to_markdown(header, rows).count("\n") == 5
    main([str(tmp_path), "--metrics", "Bleu_4,CIDEr", "--out", str(tmp_path / "table.md")])
    out = capsys.readouterr().out
    assert "| soft | 0.5123 | 1.5000 |" in out and "1 of 3 runs have no metrics.json" in out
    assert (tmp_path / "table.csv").read_text().splitlines()[0] == "attention,Bleu_4,CIDEr,run"


def test_every_score_column_has_the_same_places_in_markdown_and_csv(tmp_path, capsys):
    """Scores with 4 decimals whatever their size (no 3 here and 4 there), seconds with 1, counts as integers; the
    CSV holds the very cells of the Markdown table."""
    metrics = {"Bleu_4": 0.123456, "CIDEr": 1.23456, "METEOR": 0.2, "attention_correctness": 0.61237,
               "val_CIDEr": 12.5, "train_seconds": 600.3, "num_images": 250, "epochs": 23}
    _run(tmp_path / "sweep", 0, ["optim.lr=0.001"], metrics)
    _run(tmp_path / "sweep", 1, ["optim.lr=0.01"], {**metrics, "CIDEr": 0.98765, "train_seconds": 1234.56})
    names = list(metrics)
    main([str(tmp_path / "sweep"), "--metrics", ",".join(names), "--out", str(tmp_path / "t.md")])
    cells = [["0.1235", "1.2346", "0.2000", "0.6124", "12.5000", "600.3", "250", "23"],
             ["0.1235", "0.9877", "0.2000", "0.6124", "12.5000", "1234.6", "250", "23"]]
    markdown = (tmp_path / "t.md").read_text().splitlines()
    assert markdown[0] == "| optim.lr | " + " | ".join(names) + " | run |"
    assert [line.split(" | ")[1:-1] for line in markdown[2:]] == cells
    csv_rows = list(csv.reader(io.StringIO((tmp_path / "t.csv").read_text())))
    assert csv_rows[0] == ["optim.lr", *names, "run"] and [row[1:-1] for row in csv_rows[1:]] == cells
    assert "| 0.001 | 0.1235 | 1.2346 | 0.2000 | 0.6124 | 12.5000 | 600.3 | 250 | 23 |" in capsys.readouterr().out


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        collect_runs(tmp_path / "missing")
    with pytest.raises(ValueError, match="no Hydra runs"):
        collect_runs(tmp_path)


def _sweep(root):
    """Four finished runs over a numeric and a categorical parameter, one killed run and one broken folder."""
    values = [("0.001", "soft", 1.0), ("0.01", "soft", 1.4), ("0.001", "hard", 0.8), ("0.1", "hard", 0.5)]
    for i, (lr, att, cider) in enumerate(values):
        _run(root, i, [f"optim.lr={lr}", f"attention={att}", "seed=0"], {"CIDEr": cider, "Bleu_4": cider / 4})
    killed = _run(root, 4, ["optim.lr=0.05", "attention=soft", "seed=0"])
    (killed / "history.json").write_text(json.dumps([{"epoch": 1}, {"epoch": 2}]))
    broken = _run(root, 5, ["optim.lr=0.2", "attention=dot", "seed=0"])
    (broken / "metrics.json").write_text("{ not json")


def test_sweep_series_values(tmp_path):
    _sweep(tmp_path)
    runs = collect_runs(tmp_path)
    assert swept_params(runs) == ["attention", "optim.lr"]
    attention, lr = sweep_series(runs, "CIDEr")
    assert not attention.numeric and attention.points == [("soft", 1.0), ("soft", 1.4), ("hard", 0.8), ("hard", 0.5)]
    assert lr.numeric and lr.points == [(0.001, 0.8), (0.001, 1.0), (0.01, 1.4), (0.1, 0.5)]  # sorted by value
    assert [r.status for r in runs[4:]] == ["no metrics.json after 2 epochs", "no metrics.json after 0 epochs"]


def test_plot_and_unfinished_runs_in_the_output(tmp_path, capsys):
    _sweep(tmp_path / "sweep")
    main([str(tmp_path / "sweep"), "--metrics", "CIDEr", "--out", str(tmp_path / "out" / "table.md")])
    out = capsys.readouterr().out
    png = tmp_path / "out" / "table.png"
    assert f"plot of CIDEr against attention, optim.lr: {png}" in out
    image = imread(png)
    assert image.shape[1] == 800 and image.shape[0] == 320  # two 4 x 3.2 inch panels at 100 dpi
    assert image[..., :3].std() > 0.05  # something was drawn
    assert "| attention | optim.lr | CIDEr | run |" in out and "\nsame in every run: seed=0\n" in out
    assert "2 of 6 runs have no metrics.json" in out
    assert f"- {tmp_path / 'sweep' / '4'}: no metrics.json after 2 epochs" in out
    assert out.count("failed/unfinished") == 2
    main([str(tmp_path / "sweep"), "--metrics", "CIDEr", "--all-overrides"])
    assert "| attention | optim.lr | seed | CIDEr | run |" in capsys.readouterr().out
    # A metric no run reports: the table is still printed, the plot is skipped with a message.
    main([str(tmp_path / "sweep"), "--plot", str(tmp_path / "m.png"), "--plot-metric", "SPICE"])
    assert "no plot: no finished run reports SPICE" in capsys.readouterr().out
    assert not (tmp_path / "m.png").exists()


def test_only_unfinished_runs_do_not_crash(tmp_path, capsys):
    _run(tmp_path, 0, ["decoder.dropout=0.1"])
    (tmp_path / "1" / ".hydra").mkdir(parents=True)  # killed before Hydra wrote overrides.yaml
    assert plot_sweep(collect_runs(tmp_path), "CIDEr", tmp_path / "p.png") is None
    main([str(tmp_path), "--plot", str(tmp_path / "p.png")])
    assert "2 of 2 runs have no metrics.json" in capsys.readouterr().out
