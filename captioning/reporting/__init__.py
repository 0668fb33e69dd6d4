"""The output side: attention figures, the HTML report, training curves, sweep tables.

    figures.py   per-word attention overlays (matplotlib)
    items.py     Prediction (a decoded image) and ReportItem (a report row)
    numbers.py   format_metric: how the page and the sweep table write a metric (integers, seconds, scores)
    page.py      the report page's markup, style and script (and the heatmap drawing the demo page shares)
    html.py      report.html and attention.npz of a decoded split
    npz.py       open_npz: an .npz whose headers are checked before anything is loaded (attention.npz is data)
    curves.py    curves.png from a run's history.json
    sweep.py     a Hydra sweep's runs as one table and a plot
"""
