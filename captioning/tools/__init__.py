"""The console tools besides training and evaluation: caption, score, html, report, extract-features,
prepare, export, run-export, demo (apps)."""
