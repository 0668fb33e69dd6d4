"""The console tools besides training and evaluation: caption, score, html, report, extract-features,
prepare, export, run-export, demo (apps), and
`python -m captioning.tools.shapes` (generate the synthetic data set)."""
