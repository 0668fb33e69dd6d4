"""The output side: attention figures, the HTML report, training curves, sweep tables, a run's output files.

    figures.py   per-word attention overlays (matplotlib)
    items.py     ReportItem, the row type the page and its builders share; format_value for table cells
    page.py      the report page's markup, style and script (and the heatmap drawing the demo page shares)
    demo_page.py the page of captioning-demo and the JSON of one captioned upload
    html.py      report.html and attention.npz of a decoded split
    curves.py    curves.png from a run's history.json
    sweep.py     a Hydra sweep's runs as one table and a plot
    outputs.py   write_outputs: every file a decoded split leaves in its run folder
"""
