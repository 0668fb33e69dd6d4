"""decoder=transformer's map choice (cross-attention layer and head) in captioning-caption, the API and evaluation."""

import json

import pytest
import torch
from fixtures import TINY_MODEL
from omegaconf import OmegaConf
from PIL import Image

from captioning.checkpoint import save_checkpoint
from captioning.data.vocab import Vocabulary
from captioning.evaluation.split import EvalSettings
from captioning.factory.models import build_captioner
from captioning.inference.model import load
from captioning.inference.outputs import SETTINGS_SUFFIX
from captioning.models.captioner import select_attention_map
from captioning.runtime import CONF_DIR
from captioning.tools.caption import main

TRANSFORMER = {**TINY_MODEL,
               "attention": {"_target_": "multihead", "num_heads": 2,
                             "head_dim": 8},
               "decoder": {"_target_": "transformer", "d_model": 16,
                           "num_layers": 2, "num_heads": 2, "ff_dim": 32}}


def _checkpoint(tmp_path, cfg):
    vocab = Vocabulary.build([["a", "red", "circle"], ["a", "blue", "square"]])
    torch.manual_seed(0)
    model = build_captioner(cfg, len(vocab))
    with torch.no_grad():  # sharper attention, so that layers and heads differ visibly
        for name, p in model.decoder.named_parameters():
            if "bias" not in name:
                p.mul_(3.0)
        if hasattr(model.decoder, "out"):
            model.decoder.out.bias[Vocabulary.end_id] = -50.0  # captions of max_len words: maps to compare
    return save_checkpoint(tmp_path / "model.pt", model, vocab, {"model": cfg})


def test_the_api_captions_with_the_chosen_layer_and_head(tmp_path):
    ckpt = _checkpoint(tmp_path, TRANSFORMER)
    image = Image.new("RGB", (32, 32), "red")
    image.paste((0, 0, 255), (0, 0, 12, 12))
    model = load(ckpt, "cpu")
    mean_last = model.caption(image, beam_size=1, max_len=4).attention
    model.select_attention_map(0, 1)
    head = model.caption(image, beam_size=1, max_len=4)
    decoder = model.model.decoder
    assert (decoder.map_layer, decoder.map_head) == (0, 1)
    decoder.select_map(-1, None)
    assert torch.allclose(torch.as_tensor(model.caption(image, beam_size=1, max_len=4).attention),
                          torch.as_tensor(mean_last))
    assert not torch.allclose(torch.as_tensor(head.attention), torch.as_tensor(mean_last))
    assert torch.allclose(torch.as_tensor(head.attention).sum((1, 2)), torch.ones(len(head.words)))  # (T, h, w)


def test_the_caption_command_takes_a_layer_and_head_and_records_them(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path, TRANSFORMER)
    Image.new("RGB", (32, 32), "red").save(tmp_path / "x.png")
    log = tmp_path / "log.jsonl"
    code = main([str(tmp_path / "x.png"), "--checkpoint", str(ckpt), "--attention-layer", "0", "--attention-head",
                 "1", "--max-len", "4", "--jsonl", str(log), "--figures", str(tmp_path / "figs")])
    assert code == 0 and len(list((tmp_path / "figs").glob("*.png"))) <= 1
    settings = json.loads(log.with_name(log.name + SETTINGS_SUFFIX).read_text())
    assert settings["attention_layer"] == 0 and settings["attention_head"] == 1  # --resume checks them


@pytest.mark.parametrize(("cfg", "args", "message"), [
    (TRANSFORMER, ["--attention-head", "2"], "head 2 does not exist: the cross-attention has 2 heads"),
    (TRANSFORMER, ["--attention-layer", "5"], "layer 5 does not exist: the decoder has 2 layers"),
    (TINY_MODEL, ["--attention-layer", "0"], "applies to decoder=transformer only"),
])
def test_a_map_that_does_not_exist_is_one_error_line(tmp_path, capsys, cfg, args, message):
    ckpt = _checkpoint(tmp_path, cfg)
    Image.new("RGB", (32, 32), "red").save(tmp_path / "x.png")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "x.png"), "--checkpoint", str(ckpt), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


def test_eval_settings_carry_the_map_choice_to_the_model():
    ev = EvalSettings.of(OmegaConf.create({**OmegaConf.load(CONF_DIR / "eval" / "default.yaml"), "attention_layer": 0,
                                           "attention_head": 1}))
    torch.manual_seed(0)
    model = build_captioner(TRANSFORMER, 10)
    select_attention_map(model, ev.attention_layer, ev.attention_head)
    assert (model.decoder.map_layer, model.decoder.map_head) == (0, 1)
    select_attention_map(model, None, None)  # nothing asked: the decoder keeps its choice
    assert (model.decoder.map_layer, model.decoder.map_head) == (0, 1)
