"""Using a trained model: the Python API (`model.py`), the images a command is given (`sources.py`), the files a
captioning run over many images writes and continues (`outputs.py`), and captioning-demo's page
(`demo_page.py`), its requests (`demo_app.py`) and its bounded HTTP server (`demo_server.py`)."""
