"""Export a captioner (encoder + one decoder step) to ONNX or TorchScript, and caption from the exported files.

    exporter.py    (torch)  `export_checkpoint` / `export_model`: three graphs + captioning.json, checked on write
    graphs.py      (torch)  the graph modules and what makes the model's code traceable
    manifest.py             captioning.json: format, files, vocabulary, preprocessing, grid, state layout
    preprocess.py           the encoder's transform() as data, applied with PIL and NumPy
    search.py               greedy decoding and beam search in NumPy (ports of captioning.models.decoding)
    runner.py               `Runner(folder).caption(images)`: ONNX Runtime + NumPy + PIL, no torch
    torchscript.py (torch)  TorchScript folders for the runner

This package's __init__ imports nothing, so `captioning.export.runner` loads without torch.
"""
