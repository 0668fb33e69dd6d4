"""Using a trained model: the Python API (`model.py`), the images a command is given (`sources.py`), the files a
captioning run over many images writes and continues (`outputs.py`), and the page of captioning-demo
(`demo_page.py`) with its bounded HTTP server (`demo_server.py`)."""
