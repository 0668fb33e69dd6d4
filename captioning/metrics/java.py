"""coco-caption's Java tools, run as pycocoevalcap runs them: the Stanford PTB tokenizer jar, METEOR 1.5 and SPICE
(coco.py's score_captions calls them; without Java the tokenizer is the pure-Python one and METEOR/SPICE are
skipped with the reason)."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from captioning.metrics.tokenizer import clean_caption, strip_punctuation

logger = logging.getLogger(__name__)

SPICE_HOWTO = ("to enable SPICE, run once on a machine with internet access "
                "`python -c \"from pycocoevalcap.spice.spice import Spice; Spice()\"` so that pycocoevalcap "
                "downloads the Stanford CoreNLP 3.6.0 jars it needs into pycocoevalcap/spice/lib/ "
                "(SPICE also needs Java 8 or newer on the PATH)")


# The tokenizer is a short-lived JVM: compiling with the quick C1 compiler only and the serial garbage
# collector halves its CPU time (same output; flags unknown to a JVM are ignored).
_JVM_OPTIONS = ("-XX:+IgnoreUnrecognizedVMOptions", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def _ptb_jar() -> str:
    from pycocoevalcap.tokenizer import ptbtokenizer

    folder = os.path.dirname(os.path.abspath(ptbtokenizer.__file__))
    return os.path.join(folder, ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)


def java_ptb_tokenize(captions: Mapping[Any, Sequence[str]], java: str = "java") -> dict[Hashable, list[str]]:
    """coco-caption's ``PTBTokenizer().tokenize`` on plain strings, run robustly.

    Same jar, command line (``edu.stanford.nlp.process.PTBTokenizer -preserveLines -lowerCase``),
    caption order and punctuation removal as pycocoevalcap, but the JVM runs with start-up friendly
    options (:data:`_JVM_OPTIONS`, about half the CPU time), the temporary file goes to the system
    temporary directory (not into site-packages), the tool's stderr is logged instead of printed, a
    failure raises instead of yielding misaligned captions, and line breaks inside captions are
    replaced by spaces first.
    """
    ids: list[Hashable] = []
    lines: list[str] = []
    for key, caps in captions.items():
        for cap in caps:
            ids.append(key)
            lines.append(clean_caption(cap))
    out: dict[Hashable, list[str]] = {key: [] for key in captions}
    if not lines:
        return out
    fd, path = tempfile.mkstemp(prefix="ptb_", suffix=".txt")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write("\n".join(lines).encode("utf-8"))
        cmd = [java, *_JVM_OPTIONS, "-cp", _ptb_jar(), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines",
               "-lowerCase", path]
        proc = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    finally:
        os.remove(path)
    err = proc.stderr.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        raise RuntimeError(f"the Java PTB tokenizer failed (exit code {proc.returncode}): {err[-2000:]}")
    if err:
        logger.debug("PTBTokenizer: %s", err)
    tokenized = proc.stdout.decode("utf-8").split("\n")
    if len(tokenized) < len(lines) or any(line.strip() for line in tokenized[len(lines):]):
        raise RuntimeError(f"the Java PTB tokenizer returned {len(tokenized)} lines for {len(lines)} captions")
    for key, line in zip(ids, tokenized):
        out[key].append(strip_punctuation(line))
    return out


def close_meteor(meteor: Any) -> None:
    """Shut pycocoevalcap's METEOR subprocess down (also after a failure inside compute_score)."""
    lock = getattr(meteor, "lock", None)
    if lock is not None and lock.locked():  # compute_score raised while holding its lock
        lock.release()
    close = getattr(meteor, "close", None)
    if callable(close):
        close()
    else:  # pycocoevalcap 1.2: the shutdown lives in __del__ (safe to run twice)
        meteor.__del__()


def run_meteor(gts: dict[Hashable, list[str]], res: dict[Hashable, list[str]]) -> tuple[float, list[float]]:
    from pycocoevalcap.meteor.meteor import Meteor

    meteor = Meteor()
    try:
        score, scores = meteor.compute_score(gts, res)
    finally:
        close_meteor(meteor)
    return float(score), [float(s) for s in scores]


def spice_models_present() -> bool:
    from pycocoevalcap.spice import get_stanford_models as gsm

    lib = os.path.join(os.path.dirname(os.path.abspath(gsm.__file__)), gsm.SPICELIB)
    return all(os.path.exists(os.path.join(lib, f"{gsm.JAR}{suffix}.jar")) for suffix in ("", "-models"))


def run_spice(gts: dict[Hashable, list[str]], res: dict[Hashable, list[str]]) -> tuple[float, list[float]]:
    from pycocoevalcap.spice.spice import Spice

    score, scores = Spice().compute_score(gts, res)
    per = [float(s["All"]["f"]) for s in scores]
    return float(score), per


def java_score(metric: str, gts: dict[Hashable, list[str]], res: dict[Hashable, list[str]],
               java: str | None) -> tuple[str, tuple[float, list[float]] | str]:
    """METEOR or SPICE (`metric` "meteor" | "spice"): its score name, and (corpus score, per-image scores) or why it
    was not computed."""
    if metric == "meteor":
        if not java:
            return "METEOR", ("METEOR runs the METEOR 1.5 jar and needs Java, but no `java` executable is on "
                              "the PATH; install a Java runtime (8 or newer) to compute it")
        return "METEOR", run_meteor(gts, res)
    if not java:
        return "SPICE", "SPICE needs Java, but no `java` executable is on the PATH; " + SPICE_HOWTO
    if not spice_models_present():
        return "SPICE", "the Stanford CoreNLP 3.6.0 jars used by SPICE are not installed; " + SPICE_HOWTO
    try:
        return "SPICE", run_spice(gts, res)
    except Exception as exc:  # noqa: BLE001 - any failure of the external tool becomes a skip reason
        return "SPICE", f"SPICE failed ({type(exc).__name__}: {exc}); " + SPICE_HOWTO
