"""Using a trained model: the Python API (`model.py`), the images a command is given (`sources.py`) and the files a
captioning run over many images writes and continues (`outputs.py`)."""
