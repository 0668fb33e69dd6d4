"""Caption your own images: files, folders, lists of paths or a data set's split, in batches.

    captioning-caption photo.jpg imgs/ --checkpoint best.pt                      # path<TAB>caption on stdout
    captioning-caption imgs/ --checkpoint best.pt --jsonl out.jsonl --results results.json [--resume]
    captioning-caption --annotations data/shapes/dataset_shapes.json --split test --checkpoint best.pt \
        --results r.json                                                         # scorable by captioning-score

Images are read by the one image loader and captioned through the Python API (captioning/inference/model.py),
`--batch-size` at a time, the next batch read while the model runs. Outputs: `--jsonl` (one line per image: path,
image_id, caption, log_prob, and the alternatives when asked; written batch by batch, so `--resume` continues an
interrupted run where it stopped, with the same captions), `--results` (COCO results, image ids from the split's
file, `--id-map` or the digits ending each file name), `--figures DIR` (attention figures, only when asked).
Without --jsonl and --results, `path<TAB>caption` lines go to stdout. An unreadable image is skipped with one line
on stderr and counted (exit status 1 then); a bad option, checkpoint or output file is one `error:` line and exit
status 2 before any image is read (torch and the model code load only after the options, images and checkpoint
file are checked). The last stderr line says what was captioned and where it went.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image
from tqdm import tqdm

from captioning.base.decoding import BEAM_SIZE, MAX_LEN
from captioning.base.messages import one_line, printable
from captioning.checkpoint import check_checkpoint_file
from captioning.cli import ArgumentParser, positive_int, run_cli, writable_dir, writable_file
from captioning.data.images import ImageError, load_image
from captioning.inference.outputs import CaptionLog, file_sha256, write_results
from captioning.inference.sources import ImageSource, assign_ids, collect_images, split_images

if TYPE_CHECKING:
    from captioning.inference.model import CaptionModel, CaptionResult

PROG = "captioning-caption"


def count(n: int, noun: str) -> str:
    """'1 image', '2 images'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def open_image(path: Path) -> Image.Image:
    """Read an image as the data sets do (RGB, EXIF rotation applied); an ImageError names the file otherwise."""
    return load_image(path)


def figure_names(paths: Sequence[Path]) -> list[str]:
    """One distinct figure file name per image: its stem, with its folder's name (then its position) on a clash."""
    stems = Counter(p.stem for p in paths)
    names = [p.stem if stems[p.stem] == 1 else f"{p.resolve().parent.name}_{p.stem}" for p in paths]
    counts = Counter(names)
    return [f"{n}_{k}.png" if counts[n] > 1 else f"{n}.png" for k, n in enumerate(names)]


def _read(batch: list[ImageSource]) -> tuple[list[ImageSource], list[Image.Image], list[str]]:
    """The readable images of a batch, and one message per unreadable one."""
    kept, images, errors = [], [], []
    for src in batch:
        try:
            images.append(load_image(src.path))
            kept.append(src)
        except ImageError as err:
            errors.append(str(err))
    return kept, images, errors


def _read_ahead(todo: list[ImageSource], size: int) -> Iterator[tuple[list[ImageSource], list[Image.Image],
                                                                      list[str]]]:
    """Batches of read images; the next batch is read in a thread while the caller captions this one."""
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_read, batches[0]) if batches else None
        for n in range(len(batches)):
            assert pending is not None
            ready = pending.result()
            pending = pool.submit(_read, batches[n + 1]) if n + 1 < len(batches) else None
            yield ready


def _caption(model: CaptionModel, srcs: list[ImageSource], images: list[Image.Image], options: dict[str, Any],
             errors: list[str]) -> list[tuple[ImageSource, CaptionResult]]:
    """Caption a batch; where the batch fails (e.g. an image too small for an encoder without an input size), each
    image alone, so only the images that cannot be captioned are skipped."""
    try:
        return list(zip(srcs, model.caption_batch(images, [s.key for s in srcs], **options)))
    except RuntimeError as err:
        if len(srcs) == 1:
            errors.append(f"cannot caption {srcs[0].path}: {one_line(err)}")
            return []
    return [pair for s, im in zip(srcs, images) for pair in _caption(model, [s], [im], options, errors)]


def _row(src: ImageSource, result: CaptionResult) -> dict[str, Any]:
    row: dict[str, Any] = {"path": src.key, "image_id": src.image_id, "caption": result.caption,
                           "log_prob": round(result.log_prob, 6)}
    if result.alternatives:
        row["alternatives"] = result.to_dict()["alternatives"]
    return row


def _sources(args: argparse.Namespace) -> list[ImageSource]:
    if args.annotations:
        if args.images or args.list:
            raise ValueError("give either --annotations (a data set's split) or images, folders and --list files")
        return split_images(args.annotations, args.split, args.image_root)
    sources = collect_images(args.images, args.list, args.glob)
    return assign_ids(sources, args.id_map) if args.results or args.id_map else sources


def caption_run(args: argparse.Namespace) -> int:
    """Caption every image the arguments name and write the outputs asked for; returns the number skipped."""
    _check_outputs(args)
    sources = _sources(args)  # every path checked before the model is loaded
    check_checkpoint_file(args.checkpoint)  # a missing or foreign file is refused before torch is imported
    from captioning.inference.model import load

    model = load(args.checkpoint, args.device)
    model.select_attention_map(args.attention_layer, args.attention_head)
    options = {"beam_size": args.beam_size, "max_len": args.max_len, "alternatives": args.alternatives,
               "suppress_unk": not args.allow_unk}
    maps = {k: v for k in ("attention_layer", "attention_head") if (v := getattr(args, k)) is not None}
    settings = {"checkpoint": str(Path(args.checkpoint).resolve()), "checkpoint_sha256": file_sha256(args.checkpoint),
                **options, **maps}
    log = CaptionLog(args.jsonl, settings, args.resume) if args.jsonl else None
    earlier = {s.key for s in sources} & set(log.done) if log else set()
    todo = [s for s in sources if s.key not in earlier]
    names = dict(zip((s.key for s in sources), figure_names([s.path for s in sources])))
    rows: list[dict[str, Any]] = []
    skipped, figures, start, echo = 0, 0, time.perf_counter(), not (args.jsonl or args.results)
    bar = tqdm(total=len(sources), initial=len(earlier), unit="img", desc="caption", disable=None, file=sys.stderr)
    try:
        for srcs, images, errors in _read_ahead(todo, args.batch_size):
            done = _caption(model, srcs, images, options, errors) if srcs else []
            for message in errors:
                tqdm.write(f"{PROG}: skipped: {one_line(message)}", file=sys.stderr)
            skipped += len(errors)
            new = [_row(src, result) for src, result in done]
            rows += new
            if log:
                log.append(new)
            for src, result in done:
                if echo:
                    tqdm.write(f"{printable(src.key)}\t{result.caption}", file=sys.stdout)  # one line each
                if args.figures and result.words:
                    model.plot(result, Path(args.figures) / names[src.key])
                    figures += 1
            bar.update(len(srcs) + len(errors))
    except KeyboardInterrupt:
        if log:
            print(f"{PROG}: interrupted; {len(log.done)} captions are in {log.path}: run the same command with "
                  "--resume to continue", file=sys.stderr)
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    said = [f"captioned {count(len(rows), 'image')} in {seconds:.1f} s ({len(rows) / max(seconds, 1e-9):.1f} images/s)"]
    if earlier:
        said.append(f"{len(earlier)} more from the earlier run")
    if skipped:
        said.append(f"skipped {skipped} that could not be read or captioned")
    said += _write_outputs(args, sources, rows, log, figures)
    print(f"{PROG}: " + "; ".join(said), file=sys.stderr)
    return skipped


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, outputs that cannot be written and --resume without the log it continues."""
    if args.resume and not args.jsonl:
        raise ValueError("--resume continues a run from its --jsonl log: give --jsonl FILE")
    for path in (args.results, args.jsonl):
        if path:
            writable_file(path)
    if args.figures:
        writable_dir(args.figures)


def _write_outputs(args: argparse.Namespace, sources: list[ImageSource], rows: list[dict[str, Any]],
                   log: CaptionLog | None, figures: int) -> list[str]:
    """Write the COCO results file (every image captioned, by this run or the one it continues); what the run
    wrote, said in parts of the summary line."""
    said = []
    if args.results:
        kept = [log.done[s.key] for s in sources if s.key in log.done] if log else rows
        said.append(f"results: {args.results} ({write_results(args.results, kept)} images)")
    if log:
        said.append(f"log: {log.path}")
    if args.figures:
        said.append(f"{count(figures, 'figure')} in {args.figures}")
    return said


def _count(text: str) -> int:
    """argparse type: an integer, 0 or more (a head number)."""
    return positive_int(text) if text.strip() != "0" else 0


def _alternatives(text: str) -> int:
    """argparse type: 0..20 alternatives."""
    value = _count(text)
    if value > 20:
        raise argparse.ArgumentTypeError(f"at most 20, got {value}")
    return value


def parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description="Caption images with a trained checkpoint: image files, folders "
                       "(searched recursively), --list files of paths, or a data set's split (--annotations).",
                       epilog="examples: captioning-caption photo.jpg --checkpoint outputs/<run>/checkpoints/best.pt "
                       "--figures figs/ | captioning-caption val2014/ --checkpoint best.pt --jsonl val.jsonl "
                       "--results val_results.json --resume")
    p.add_argument("images", nargs="*", type=Path, help="image files and folders")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--list", action="append", default=[], type=Path, metavar="FILE",
                   help="a text file of image paths, one a line (relative to its folder); repeatable")
    p.add_argument("--glob", action="append", default=[], metavar="PATTERN",
                   help="file names to take from folders, any letter case (default: *.jpg *.jpeg *.png *.bmp *.gif "
                   "*.webp *.tif *.tiff); repeatable")
    p.add_argument("--annotations", type=Path, help="caption a data set's split: a Karpathy split file or a COCO "
                   "caption file (then with --image-root); results carry its image ids")
    p.add_argument("--split", default="test", help="the split of a Karpathy file (default: test)")
    p.add_argument("--image-root", type=Path, help="the folder of the annotation file's images")
    p.add_argument("--id-map", type=Path, help="JSON object: file name (or path as given) -> integer image id")
    p.add_argument("--beam-size", type=positive_int, default=BEAM_SIZE)
    p.add_argument("--max-len", type=positive_int, default=MAX_LEN, help="most words per caption (>= 1)")
    p.add_argument("--alternatives", type=_alternatives, default=0, metavar="N",
                   help="also record the N best captions of the beam search (0-20; in --jsonl)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass")
    p.add_argument("--allow-unk", action="store_true", help="let captions hold <unk> (by default decoding never emits "
                   "it, as eval.suppress_unk)")
    p.add_argument("--results", type=Path, help="write a COCO results file [{image_id, caption}] here")
    p.add_argument("--jsonl", type=Path, help="write one JSON line per image here (path, image_id, caption, "
                   "log_prob); the record --resume continues from")
    p.add_argument("--resume", action="store_true", help="continue the run recorded in --jsonl")
    p.add_argument("--figures", "--out", type=Path, help="write each image's attention figure into this folder "
                   "(--out: its earlier name)")
    p.add_argument("--attention-layer", type=int, metavar="I", help="decoder=transformer: the cross-attention "
                   "layer whose map figures show (-1: the last; default: the checkpoint's decoder.map_layer)")
    p.add_argument("--attention-head", type=_count, metavar="J", help="decoder=transformer with attention=multihead: "
                   "one head's map instead of the mean over heads")
    p.add_argument("--device", default="auto")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, or 1 when some image was skipped)."""
    args = parser().parse_args(argv)
    skipped = run_cli(lambda: caption_run(args), PROG, (ValueError, OSError, RuntimeError))
    return 1 if skipped else 0


def cli() -> None:
    """Console script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
