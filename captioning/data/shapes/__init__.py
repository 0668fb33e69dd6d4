"""The built-in synthetic data set `shapes` (its command: `python -m captioning.tools.shapes`).

    generate.py  `build_shapes`: the images, drawn from a seed, and the data set's Karpathy file
    captions.py  the objects, their relations and the phrasings that describe them
"""
