"""Every config group entry and experiment preset composes; presets say what they promise."""


import pytest
from fixtures import compose_config

from captioning.runtime import CONF_DIR

CONF = CONF_DIR
# the paper's presets (the compared decoders' have their own: tests/config/test_decoder_presets.py; _paper*.yaml are
# the parts they share, tests/config/test_one_default_per_fact.py)
COMPARED = ("coco_updown", "coco_transformer", "coco_fc", "coco_att2in", "coco_att2all", "coco_adaptive", "coco_aoa",
            "coco_m2")
RECIPES = ("flickr8k_1k",)  # not a paper preset: the real-photo recipe for a CPU (test_the_real_photo_recipe)
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                 if not p.stem.startswith((*COMPARED, "_")) and p.stem not in RECIPES)


def test_default_is_the_cpu_shapes_run():
    cfg = compose_config()
    assert cfg.dataset.name == "shapes" and cfg.encoder._target_ == "small_cnn"
    assert cfg.attention._target_ == "soft" and cfg.device == "auto"


@pytest.mark.parametrize("preset", PRESETS)
def test_paper_presets(preset):
    cfg = compose_config(f"experiment={preset}")
    dataset = preset.split("_")[0]
    assert cfg.dataset.name == dataset and cfg.dataset.max_vocab == 10000
    scst = preset.endswith("_scst")  # self-critical fine-tuning selects by the CIDEr it optimises
    assert cfg.objective.attention_weight == 1.0 and cfg.decoder.dropout == 0.5
    assert cfg.trainer.monitor == ("CIDEr" if scst else "Bleu_4")
    assert cfg.objective._target_ == ("scst" if scst else "xe")
    assert cfg.encoder.pretrained is True
    assert cfg.encoder._target_ == ("resnet" if "resnet" in preset else "vgg")
    assert cfg.optim._target_ == ("torch.optim.RMSprop" if dataset == "flickr8k" else "torch.optim.Adam")
    assert cfg.attention._target_ == ("hard" if "hard" in preset else "soft")
    if "hard" in preset:
        assert cfg.attention.expected_context_prob == 0.5  # the paper's value, not the shapes default


def test_the_real_photo_recipe():
    """experiment=flickr8k_1k: the shared photos with their official split, a frozen ImageNet MobileNetV2 whose
    features the first run caches, the paper's lambda, early stopping on validation CIDEr."""
    cfg = compose_config("experiment=flickr8k_1k", "data_dir=/d")
    assert cfg.dataset.name == "flickr8k_1k" and cfg.dataset.reader._target_ == "table"
    assert cfg.dataset.root.endswith("shared/flickr8k-1k") and cfg.dataset.root.startswith("/")  # ${abspath:...}
    assert cfg.dataset.reader.split_file == cfg.dataset.root + "/split.csv"
    assert (cfg.dataset.annotations, cfg.dataset.image_root) == (cfg.dataset.root + "/captions.csv",
                                                                 cfg.dataset.root + "/images")
    assert cfg.dataset.extract is True and cfg.dataset.features.startswith("/d/flickr8k_1k/features/")
    assert (cfg.encoder._target_, cfg.encoder.arch, cfg.encoder.weights) == ("torchvision", "mobilenet_v2",
                                                                             "IMAGENET1K_V1")
    assert cfg.encoder.pretrained is True and cfg.encoder.fine_tune == "none"
    assert cfg.objective.attention_weight == 1.0 and cfg.trainer.monitor == "CIDEr" and cfg.eval.suppress_unk
    for other in ("attention=hard", "attention=mean", "decoder=updown"):  # the compared models compose with it
        assert compose_config("experiment=flickr8k_1k", other).dataset.name == "flickr8k_1k"


@pytest.mark.parametrize("group", ["encoder", "attention", "decoder", "dataset", "optim", "scheduler", "objective"])
def test_every_group_entry_composes(group):
    for entry in sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_")):
        cfg = compose_config(f"{group}={entry}")
        assert group in cfg


@pytest.mark.parametrize("dataset", sorted(p.stem for p in (CONF / "dataset").glob("[!_]*.yaml")))
def test_every_data_set_reads_its_split_file_unless_told_to_read_raw_coco(dataset):
    cfg = compose_config(f"dataset={dataset}", "dataset.annotations=/d/split.json", "dataset.image_root=/d/images")
    reader = dict(cfg.dataset.reader)
    if dataset == "table":  # a caption table (test_table_reader.py), not a split file
        assert (reader["_target_"], reader["annotations"], reader["split_file"]) == ("table", "/d/split.json", None)
        return
    assert reader == {"_target_": "karpathy", "annotations": "/d/split.json", "image_root": "/d/images",
                      "tokenizer": "ptb"}
    coco = compose_config(f"dataset={dataset}", "dataset/reader=coco", "dataset.image_root=/d/images", "data_dir=/d").dataset
    assert coco.reader._target_ == "coco"
    assert coco.reader.image_root == "/d/images"
    assert coco.reader.train_captions == "/d/coco/annotations/captions_train2014.json"
