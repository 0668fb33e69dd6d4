"""Data: annotation files to image records, captions, the vocabulary, images and the torch data sets (below the
models, which never import it).

    readers/    annotation files -> `ImageRecord`s: Karpathy split files, COCO caption files, tables; image paths
                kept under the image root; records written back as a Karpathy file; references for scoring
    prepared/   every split's captions as flat arrays, stored once under `dataset.prepared` and opened memory-mapped
    shapes/     the built-in synthetic data set: its images and the captions that describe them
    vocab.py    the vocabulary and the PTB-style tokenizer
    tokenizers.py  how captions become words (`dataset.tokenizer`: ptb, whitespace, char), for every room alike
    images.py   the one image loader
    dataset.py  `CaptionDataset`, `collate`: what a DataLoader reads (images, grids of a feature cache, or region
                sets padded with their mask)
"""
