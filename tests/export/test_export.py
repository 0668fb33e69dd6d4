"""captioning-export and the export runner: the exported graphs caption images word for word as the PyTorch model.

The default-sized model (conf/train.yaml's defaults) is trained for a few steps on a generated 64 px `shapes` set, so
its captions have several words and differ across images, saved as a checkpoint and exported through the console
command; every attention type (conf/attention/) with every decoder (conf/decoder/) is exported as a small random
model. Captions are compared with `Captioner.generate` (greedy and beam 3): the same words, log-probabilities and
attention maps within float rounding.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from family import refusal
from fixtures import TINY_MODEL, compose_config
from omegaconf import OmegaConf
from PIL import Image

from captioning.checkpoint import save_checkpoint
from captioning.data.images import load_image
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.vocab import Vocabulary
from captioning.export import preprocess
from captioning.export.exporter import export_checkpoint, export_model
from captioning.export.graphs import flatten_state, preprocess_steps
from captioning.export.manifest import FORMAT, MANIFEST
from captioning.export.runner import Runner
from captioning.factory import registry
from captioning.factory.load import load_model
from captioning.factory.models import build_captioner
from captioning.factory.run import build_trainer
from captioning.models.captioner import Captioner
from captioning.models.encoder import ResNetEncoder, SmallCNN
from captioning.runtime import CONF_DIR, set_seed
from captioning.tools.export import main as export_main
from captioning.tools.run_export import main as runner_main
from captioning.training.tensorboard import NullWriter

SMALL = {"attention_dim": 16, "predictor_dim": 16, "num_heads": 2, "head_dim": 8, "num_filters": 4}
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
DECODERS = sorted(p.stem for p in (CONF_DIR / "decoder").glob("*.yaml"))


def torch_captions(model: Captioner, images: torch.Tensor, beam: int, max_len: int = 20):
    """The PyTorch model's captions: (token lists, raw log-probabilities, maps, channel weights or None)."""
    decoded, _ = model.generate(images, beam, max_len)
    channels = None if decoded.channels is None else [c.numpy() for c in decoded.channels]
    return decoded.tokens, decoded.scores.numpy(), [m.numpy() for m in decoded.alphas], channels


def assert_same_captions(runner: Runner, pixels: np.ndarray, model: Captioner, beam: int, max_len: int = 20,
                         map_atol: float = 1e-5) -> list:
    """Runner and model agree word for word, on log-probabilities (1e-4) and on every word's map (1e-5), and its
    channel weights (1e-5) with channel-wise attention (decoder=adaptive: its sentinel weights)."""
    tokens, scores, maps, channels = torch_captions(model, torch.from_numpy(pixels), beam, max_len)
    got = runner.caption_pixels(pixels, beam, max_len)
    assert [c.tokens for c in got] == tokens
    np.testing.assert_allclose([c.log_prob for c in got], scores, rtol=1e-5, atol=1e-4)
    for c, m in zip(got, maps):
        np.testing.assert_allclose(c.alphas.reshape(m.shape), m, atol=map_atol)
    extras = [c.channels if c.sentinel is None else c.sentinel[:, None] for c in got]  # adaptive: its sentinel's
    assert (channels is None) == all(x is None for x in extras)
    for x, w in zip(extras, channels or []):
        assert x is not None
        np.testing.assert_allclose(x, w, atol=1e-5)
    return got


# -- the default-sized model, trained a little, through the console command --------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A checkpoint of the default config after 8 of the Trainer's epochs (32 steps) on 64 shapes images (64 px),
    and 16 test image paths. The default-sized model is what is exported here, so not debug=tiny; the epochs are
    the Trainer's own (`train_epoch`), without the validation and checkpoints of `fit` (a third of the time more)."""
    root = tmp_path_factory.mktemp("shapes64")
    cfg = compose_config(f"dataset.root={root}", "dataset.generate.num_train=64", "dataset.generate.num_val=8",
                         "dataset.generate.num_test=16", "dataset.generate.seed=1", "dataset.batch_size=16",
                         "dataset.prepared=null", "trainer.progress=false", "device=cpu", "optim.lr=0.005",
                         "scheduler=none")
    set_seed(cfg.seed)
    trainer = build_trainer(cfg, root / "run")
    for _ in range(8):
        trainer.train_epoch(NullWriter(), None)
        trainer.epoch += 1
    ckpt = trainer.save("best.pt", trainer.training_state())
    return ckpt, [r.path for r in trainer.data["test"].records]


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> tuple[Path, str]:
    """The ONNX export folder written by `captioning-export`, and what the command printed."""
    out = tmp_path_factory.mktemp("exported")
    buf = io.StringIO()  # capsys is function-scoped
    with contextlib.redirect_stdout(buf):
        assert export_main(["--checkpoint", str(trained[0]), "--out", str(out)]) == 0
    return out, buf.getvalue()


# The tests of the trained default-sized model are in the integration tier: `trained` runs 8 epochs first.
@pytest.mark.integration
def test_the_command_writes_three_graphs_and_the_manifest_and_prints_their_sizes(exported):
    out, printed = exported
    lines = printed.strip().splitlines()
    names = [Path(line.split("\t")[0]).name for line in lines[:-1]]
    assert names == ["encoder.onnx", "init.onnx", "step.onnx", MANIFEST] and lines[-1].startswith("total\t")
    assert all(line.split("\t")[1].endswith(("B", "kB", "MB")) for line in lines)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["format"] == FORMAT and manifest["backend"] == "onnx"
    assert manifest["grid"] == [8, 8] and manifest["preprocess"]["input_size"] == [64, 64]  # 64 px, 3 pools
    assert manifest["state"]["count"] == 3 and manifest["state"]["tree"] == [0, 1, 2]  # (h, c, alpha)
    assert manifest["vocab"][:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert manifest["model"]["attention"]["_target_"] == "soft"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left behind


@pytest.mark.integration
@pytest.mark.parametrize("beam", [1, 3])
def test_default_model_captions_match_pytorch_word_for_word(trained, exported, beam):
    model, vocab, _ = load_model(trained[0])
    runner = Runner(exported[0])
    paths = trained[1]
    got = runner.caption(paths, beam_size=beam)  # from the files, through the runner's own preprocessing
    transform = model.encoder.transform()
    images = torch.stack([transform(load_image(p)) for p in paths])
    tokens, scores, _, _ = torch_captions(model, images, beam)
    assert [c.words for c in got] == [vocab.decode(t) for t in tokens]
    np.testing.assert_allclose([c.log_prob for c in got], scores, rtol=1e-5, atol=1e-4)
    # a meaningful comparison: real captions, not one caption for every image
    assert len({" ".join(c.words) for c in got}) >= 3 and np.mean([len(c.words) for c in got]) >= 4
    assert_same_captions(runner, images.numpy(), model, beam)  # maps too


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_torchscript_files_load_and_caption_as_the_model(trained, tmp_path):
    out = tmp_path / "ts"
    assert export_main(["--checkpoint", str(trained[0]), "--out", str(out), "--format", "torchscript"]) == 0
    for name in ("encoder", "init", "step"):
        assert isinstance(torch.jit.load(str(out / f"{name}.pt")), torch.jit.ScriptModule)
    model, _, _ = load_model(trained[0])
    images = torch.stack([model.encoder.transform()(load_image(p)) for p in trained[1][:8]])
    runner = Runner(out)
    for beam in (1, 3):
        assert_same_captions(runner, images.numpy(), model, beam)


# -- every attention type with every decoder -------------------------------------------------------------------

def small_config(attention: str, decoder: str) -> dict:
    """conf/attention/<attention>.yaml and conf/decoder/<decoder>.yaml at test sizes, on the tiny encoder."""
    att = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{attention}.yaml"))
    dec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "decoder" / f"{decoder}.yaml"))
    att = {k: SMALL.get(k, v) for k, v in att.items()}
    dec = {k: v for k, v in dec.items() if k != "defaults"}  # conf/decoder/transformer.yaml picks its attention
    transformer = {"d_model": 16, "num_heads": 2, "ff_dim": 32}
    sizes = transformer if decoder in ("transformer", "m2") else {"embed_dim": 16, "hidden_dim": 32}
    dec = {**dec, **sizes, "dropout": 0.0}
    return {"encoder": TINY_MODEL["encoder"], "attention": att, "decoder": dec}


def random_model(cfg: dict, vocab: Vocabulary) -> Captioner:
    """A random model whose decoder weights are scaled up, so words depend more on the image (fewer ties too); not
    those of a self-attention stack over the regions (M2's encoder), which that would only make saturate."""
    torch.manual_seed(0)
    model = build_captioner(cfg, len(vocab)).eval()
    with torch.no_grad():
        for name, p in model.decoder.named_parameters():
            if "bias" not in name and not name.startswith("attention.encoder."):
                p.mul_(3.0)
    return model


@pytest.fixture(scope="module")
def shapes32(shapes_json) -> tuple[Vocabulary, np.ndarray]:
    """The tiny shapes set's vocabulary and its 12 test images (32 px) preprocessed for SmallCNN."""
    splits = read_karpathy_splits(["train", "test"], shapes_json, shapes_json.parent)
    vocab = Vocabulary.build([c for r in splits["train"] for c in r.captions])
    steps = preprocess_steps(SmallCNN().transform())
    return vocab, np.stack([preprocess.apply(load_image(r.path), steps) for r in splits["test"]])


PAIRS = [(a, d) for a in ATTENTIONS for d in DECODERS if refusal(d, a) is None]  # those the decoder takes
FIRST = {d: next(p for p in PAIRS if p[1] == d) for d in DECODERS}  # every decoder's first pair is in the default run
COMBOS = [pytest.param(a, d, marks=[] if i % 3 == 0 or FIRST[d] == (a, d) else [pytest.mark.slow], id=f"{a}-{d}")
          for i, (a, d) in enumerate(PAIRS)]


def test_every_attention_type_and_decoder_is_covered():
    fast = {p.values[0] for p in COMBOS if not p.marks}
    assert fast == set(ATTENTIONS) and len(ATTENTIONS) == 13
    assert set(DECODERS) == set(registry.DECODERS)  # every registered decoder has its conf/decoder/ file
    assert {p.values[1] for p in COMBOS if not p.marks} == set(DECODERS)


@pytest.mark.parametrize(("attention", "decoder"), COMBOS)
def test_every_attention_and_decoder_exports_and_captions_as_torch(attention, decoder, shapes32, tmp_path):
    vocab, pixels = shapes32
    cfg = small_config(attention, decoder)
    model = random_model(cfg, vocab)
    export_model(model, vocab, tmp_path, "onnx", image_size=32, model_config=cfg, optimize=False)
    runner = Runner(tmp_path)
    state = model.decoder.init_state(torch.zeros(1, 4, model.encoder.out_dim))
    assert runner.manifest.state_count == len(flatten_state(state)[0])
    # M2's maps mix two encoder layers' cross-attention through its gates, weights x3: ONNX Runtime's float32
    # rounding moves them by up to 5.1e-5 from torch's (seen; 1.5e-8 with the weights unscaled), every word and
    # log-probability the same
    map_atol = 2e-4 if decoder == "m2" else 1e-5
    for beam in (1, 3):
        assert_same_captions(runner, pixels, model, beam, max_len=12, map_atol=map_atol)
    assert_same_captions(runner, pixels[:5], model, 2, max_len=3, map_atol=map_atol)  # captions cut at max_len


VARIANTS = {
    "resnet18": {"encoder": {"_target_": "resnet", "arch": "resnet18",
                             "pretrained": False, "image_size": 64, "grid_size": 3}},
    "sat-zero-state-no-gate": {"decoder": {**TINY_MODEL["decoder"], "init_from_annotations": False,
                                           "selector": False}},
    "luong-no-input-feeding": {"decoder": {"_target_": "luong", "embed_dim": 16,
                                           "hidden_dim": 32, "input_feeding": False, "init_layers": 2}},
    "small-cnn-resizing": {"encoder": {**TINY_MODEL["encoder"], "image_size": 40}},
    # the attention options whose branch the conf/attention/ files leave out
    "local-m": {"attention": {"_target_": "local", "predictor_dim": 16, "centre": "monotonic"}},
    "location-smoothing": {"attention": {"_target_": "location", "attention_dim": 16, "num_filters": 4,
                                         "normalization": "smoothing", "sharpening": 2.0}},
    "monotonic-parallel": {"attention": {"_target_": "monotonic", "attention_dim": 16, "test_mode": "parallel",
                                         "order": "snake"}},
    "monotonic-recursive": {"attention": {"_target_": "monotonic", "energy": "luong", "test_mode": "recursive",
                                          "order": "column"}},
    "channel-sc": {"attention": {"_target_": "channel", "attention_dim": 16, "order": "sc"}},
    "channel-only": {"attention": {"_target_": "channel", "order": "c"}},
    "multilevel-gate": {"attention": {"_target_": "multilevel", "attention_dim": 16, "combine": "gate"}},
    "multilevel-concat": {"attention": {"_target_": "multilevel", "attention_dim": 16, "combine": "concat",
                                        "pool": 3}},
    "multi-encoder-multirep": {"encoder": {"_target_": "multi", "encoders": [
        {"encoder": "small_cnn", **{k: v for k, v in TINY_MODEL["encoder"].items() if k != "_target_"}},
        {"encoder": "small_cnn", "channels": [4, 6], "num_pools": 2, "coord_channels": False}]},
        "attention": {"_target_": "multirep", "attention_dim": 16, "score_dim": 8}},
}


# Luong without input feeding passes a state entry through each step unchanged (captioning/export/graphs.py,
# `distinct`), local-m carries a one-hot, monotonic attention's parallel form is a closed form of cumulative sums,
# multi-level attention's gate mixes two levels' contexts, encoder=multi normalises inside its graph and multirep
# carries its representation weights: in the default tier, the others are slow.
FAST_VARIANTS = ("luong-no-input-feeding", "local-m", "monotonic-parallel", "multilevel-gate", "multi-encoder-multirep")
@pytest.mark.parametrize("variant", [pytest.param(v, marks=[] if v in FAST_VARIANTS else [pytest.mark.slow])
                                     for v in sorted(VARIANTS)])
def test_other_encoders_and_decoder_options_export_too(variant, tmp_path):
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", *(f"w{i}" for i in range(20))])
    model = random_model({**TINY_MODEL, **VARIANTS[variant]}, vocab)
    export_model(model, vocab, tmp_path, "onnx", image_size=32, optimize=False)
    runner = Runner(tmp_path)
    pixels = torch.randn(4, 3, *runner.manifest.input_size, generator=torch.Generator().manual_seed(0)).numpy()
    for beam in (1, 3):
        assert_same_captions(runner, pixels, model, beam, max_len=10)


def test_hard_attention_that_samples_is_refused_and_exports_with_argmax(shapes32, tmp_path, capsys):
    vocab, pixels = shapes32
    cfg = small_config("hard", "sat")
    cfg["attention"]["test_mode"] = "sample"
    model = random_model(cfg, vocab)
    ckpt = save_checkpoint(tmp_path / "hard.pt", model, vocab, {"model": cfg})
    with pytest.raises(SystemExit) as exit_info:
        export_main(["--checkpoint", str(ckpt), "--out", str(tmp_path / "x"), "--image-size", "32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "test_mode=sample" in err[0]
    assert err[0].startswith("captioning-export: error: ") and not (tmp_path / "x" / MANIFEST).exists()
    export_checkpoint(ckpt, tmp_path / "argmax", image_size=32, hard_test_mode="argmax", optimize=False)
    runner = Runner(tmp_path / "argmax")
    assert runner.manifest.model["attention"]["test_mode"] == "argmax"
    model.decoder.attention.test_mode = "argmax"
    for beam in (1, 3):
        assert_same_captions(runner, pixels, model, beam, max_len=12)


# -- preprocessing ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(37, 53), (64, 64), (90, 41), (20, 300)])
def test_preprocessing_gives_the_transforms_pixels_bit_for_bit(size):
    rng = np.random.default_rng(sum(size))
    image = Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    for encoder in (SmallCNN(image_size=48), ResNetEncoder("resnet18", pretrained=False, image_size=56)):
        steps = preprocess_steps(encoder.transform())
        preprocess.check_steps(steps)
        np.testing.assert_array_equal(preprocess.apply(image, steps), encoder.transform()(image).numpy())
        assert preprocess.view(image, steps).size == encoder.view(image).size
    plain = SmallCNN()  # no resize: the pixels as they are, normalised
    np.testing.assert_array_equal(preprocess.apply(image, preprocess_steps(plain.transform())),
                                  plain.transform()(image).numpy())


def test_a_crop_larger_than_the_image_pads_as_torchvision():
    from torchvision import transforms as T

    image = Image.fromarray(np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3))
    for size in ([9, 8], [4, 12], [6, 6]):
        want = np.asarray(T.CenterCrop(size)(image))
        np.testing.assert_array_equal(np.asarray(preprocess.center_crop(image, size)), want)


# -- bad input ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported_small(shapes32, tmp_path_factory) -> Path:
    """A random tiny model (TINY_MODEL: no resize) exported for 64 x 64 images, as `exported` is: an export to break
    or feed bad input, without the 8 epochs of `trained`."""
    vocab, _ = shapes32
    out = tmp_path_factory.mktemp("exported_small")
    export_model(random_model(TINY_MODEL, vocab), vocab, out, "onnx", image_size=64, model_config=TINY_MODEL,
                 optimize=False)
    return out


def _copy(exported: Path, tmp_path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(exported, folder)
    return folder


def test_a_folder_that_is_not_an_export_is_refused(tmp_path, exported_small):
    with pytest.raises(FileNotFoundError, match="has no captioning.json"):
        Runner(tmp_path)
    with pytest.raises(FileNotFoundError, match="export folder not found"):
        Runner(tmp_path / "missing")
    folder = _copy(exported_small, tmp_path)
    (folder / "step.onnx").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete export: step.onnx"):
        Runner(folder)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda text: text[: len(text) // 2], "is not valid JSON"),
    (lambda text: "[1, 2]", "a JSON object was expected"),
    (lambda text: text.replace(FORMAT, "captioning-export/v0"), "has format 'captioning-export/v0'"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "grid"}), "has no 'grid' field"),
    (lambda text: json.dumps({**json.loads(text), "grid": [8]}), "field 'grid' must be two integers from 1 to 2048"),
    (lambda text: json.dumps({**json.loads(text), "preprocess": {**json.loads(text)["preprocess"],
                                                                 "input_size": [10**6, 10**6]}}),
     "field 'preprocess.input_size' must be two integers from 1 to 2048, got \\[1000000, 1000000\\]"),
    (lambda text: json.dumps({**json.loads(text), "backend": "tflite"}), "backend 'tflite'"),
    (lambda text: text.replace('"state_in_0"', '"h_in"'), "not this version's"),
    (lambda text: text.replace('"to_tensor"', '"to_tensors"'), "unknown preprocessing step"),
])
def test_a_malformed_or_foreign_manifest_is_one_clear_error(exported_small, tmp_path, edit, message):
    folder = _copy(exported_small, tmp_path)
    path = folder / MANIFEST
    path.write_text(edit(path.read_text()))
    with pytest.raises(ValueError, match=message):
        Runner(folder)


def test_a_corrupt_graph_and_a_wrong_image_size_are_refused(exported_small, tmp_path):
    folder = _copy(exported_small, tmp_path)
    (folder / "init.onnx").write_bytes(b"not a graph")
    with pytest.raises(ValueError, match="init.onnx is not a loadable ONNX graph"):
        Runner(folder)
    with pytest.raises(ValueError, match="is 40 x 30 pixels after preprocessing, but this export takes 64 x 64"):
        Runner(exported_small).caption([Image.new("RGB", (40, 30), "red")])


def test_the_commands_give_one_error_line_for_bad_input(tmp_path, capsys):
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    cases = [
        (export_main, ["--checkpoint", str(tmp_path / "notes.pt"), "--out", str(tmp_path / "o")],
         "is not a readable captioning checkpoint"),
        (export_main, ["--checkpoint", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "o")],
         "checkpoint not found"),
        (runner_main, [str(tmp_path), str(tmp_path / "x.png")], "has no captioning.json"),
    ]
    for main, argv, fragment in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_the_runner_command_captions_and_skips_unreadable_images(exported_small, tmp_path, capsys):
    (tmp_path / "bad.png").write_text("not an image")
    paths = []
    for k, colour in enumerate(("red", "teal", "gold")):  # 64 px, the export's size
        image = Image.new("RGB", (64, 64), "grey")
        image.paste(colour, (8 * k, 4 * k, 8 * k + 30, 4 * k + 24))
        image.save(tmp_path / f"{colour}.png")
        paths.append(str(tmp_path / f"{colour}.png"))
    assert runner_main([str(exported_small), *paths, str(tmp_path / "bad.png"), "--beam-size", "3"]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == paths
    expected = Runner(exported_small).caption(paths, beam_size=3)
    assert [line.split("\t")[1] for line in lines] == [" ".join(c.words) for c in expected]
    assert "skipped" in err and "bad.png" in err and len(err.strip().splitlines()) == 1
