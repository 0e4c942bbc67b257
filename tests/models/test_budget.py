"""Small files, bounded cost (docs/safety.md, the budget): checkpoints whose pickle calls a constructor or nests a
million deep, model YAMLs (in a checkpoint or given as --cfg) describing gigabytes, infinite multiples or 20 million
anchors, TorchScript whose literal sizes make gigabytes. Each is refused before the allocation, in one `error:`
line; the heavy ones are measured in a process whose memory is capped; every official model stays far inside."""

import re

import numpy as np
import pytest
import torch
import untrusted_corpus as corpus
import yaml

from models import untrusted
from models.backend import InferenceBackend
from models.checkpoints import UnsafeCheckpoint, attempt_load, load_checkpoint
from models.untrusted import UnsafeTorchScript
from models.yolo import DetectionModel, check_cost, yaml_model_load
from tests.capped import refused_once, run_capped
from utils.budget import ACTIVATION_BYTES_PER_INPUT, MAX_MODEL_BYTES, MAX_WEIGHT_BYTES, WORK_PER_INPUT
from utils.dry_run import dry_run
from utils.errors import BadCheckpoint, BadModelYaml


def _pickles(d):
    """name -> (file, words of its refusal)."""
    return {
        "Conv2d(512, 1024, 32)": (corpus.constructor_call(d / "conv.pt", torch.nn.Conv2d, 512, 1024, 32),
                                  "it calls torch.nn.modules.conv.Conv2d with arguments (512, 1024, 32)"),
        "torch.Tensor(10**9)": (corpus.constructor_call(d / "tensor.pt", torch.Tensor, 10**9),
                                "it calls torch.Tensor with arguments (1000000000,)"),
        "numpy _reconstruct of 10 GB": (corpus.constructor_call(d / "np.pt", np.core.multiarray._reconstruct,
                                                                np.ndarray, (10**5, 10**5), b"b"),
                                        "_reconstruct with arguments ('numpy.ndarray', (100000, 100000)"),
        "1,000,000 nested lists": (corpus.deep_pickle(d / "lists.pt", 1_000_000, "lists"),
                                   "keeps more than 4096 values on its stack"),
        "1,000,000 nested tuples": (corpus.deep_pickle(d / "tuples.pt", 1_000_000, "tuples"),
                                    "nests tuples deeper than 64 levels"),
    }


def _yamls(d):
    return {
        "anchors: 20000000": (corpus.yaml_in_checkpoint(d / "anchors.pt", anchors=20_000_000),
                              "'anchors' is 20000000, beyond what a model takes"),
        "32 leading upsamplings": (corpus.yaml_in_checkpoint(d / "up.pt", upsamples=32), "activations of more than"),
        "width_multiple: .inf": (corpus.yaml_in_checkpoint(d / "inf.pt", width_multiple=float("inf")),
                                 "width_multiple must be a finite number > 0, got inf"),
        "nc: 10**9": (corpus.yaml_in_checkpoint(d / "nc.pt", nc=10**9), "'nc' is 1000000000"),
    }


def test_pickles_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached for a refused file"))
    for name, (path, words) in _pickles(tmp_path).items():
        with pytest.raises(UnsafeCheckpoint, match=rf"^refusing {re.escape(str(path))}: .*{re.escape(words)}"):
            load_checkpoint(path)
        assert path.stat().st_size < 3 << 20, name


def test_model_yamls_in_checkpoints_are_refused_before_they_are_built(tmp_path):
    for name, (path, words) in _yamls(tmp_path).items():
        with pytest.raises(BadCheckpoint, match=rf"its model is malformed \(BadModelYaml: .*{re.escape(words)}"):
            attempt_load(path)


def test_a_pickle_larger_than_the_budget_is_refused_unread(tmp_path, monkeypatch):
    path = corpus.expanded_view(tmp_path / "ok.pt", 4)  # an ordinary checkpoint, its pickle a few KiB
    load_checkpoint(path)
    monkeypatch.setattr(untrusted, "MAX_PICKLE_BYTES", 1024)
    with pytest.raises(UnsafeCheckpoint, match=r"its data.pkl holds \d+ bytes, more than the 1024 of any"):
        load_checkpoint(path)


def test_torchscript_literals_and_what_they_make(tmp_path):
    """A traced classifier whose `torch.full` is edited: a literal of 3.4 G is refused by reading the code, one of
    40000 x 40000 (each number small) by the dry run; the unedited file runs."""
    honest = corpus.torchscript_full(tmp_path / "ok.torchscript", [1, 3])
    assert InferenceBackend(honest)(torch.zeros(1, 3, 64, 64)).shape == (1, 3)
    with pytest.raises(UnsafeTorchScript, match=r"holds the literal 3400000000, larger than any size"):
        InferenceBackend(corpus.torchscript_full(tmp_path / "big.torchscript", [1, 3_400_000_000]))
    with pytest.raises(UnsafeTorchScript, match=r"run on a 1x3x64x64 input, it would make constants of more than"):
        InferenceBackend(corpus.torchscript_full(tmp_path / "square.torchscript", [40000, 40000]))


def test_every_refusal_is_one_line_with_memory_capped(tmp_path):
    """Whole processes whose memory is capped at 2 GiB (each attack unrefused would need more: Conv2d 2 GiB, the
    upsamplings 3.4 GB, the TorchScript 6.4 GB): exit 2, one `error:` line naming the reason, peak far under."""
    ts = corpus.torchscript_full(tmp_path / "square.torchscript", [40000, 40000])
    pt = {**_pickles(tmp_path), **_yamls(tmp_path)}
    cases = [(["detect.py", "--weights", str(p)], words) for name, (p, words) in pt.items()
             if name in ("Conv2d(512, 1024, 32)", "32 leading upsamplings", "1,000,000 nested lists")]
    cases.append((["classify/predict.py", "--weights", str(ts)], "constants of more than"))
    for argv, words in cases:
        r = run_capped([*argv, "--source", "data/images", "--device", "cpu", "--project", str(tmp_path / "r")])
        assert refused_once(r, words), (argv, r.stderr[-2000:])
        assert r.peak < 1 << 30, (argv, f"peak {r.peak / 2 ** 20:.0f} MiB")


def test_cfg_yamls_are_one_line_errors(tmp_path):
    """--cfg files: an infinite multiple (OverflowError), 5000 levels of nesting (RecursionError), aliases that
    unfold to billions, anchors of 20 M: each one BadModelYaml naming the file."""
    base = yaml_model_load("yolov5n.yaml")
    base.pop("yaml_file")
    files = {"inf": {**base, "width_multiple": float("inf")}, "anchors": {**base, "anchors": 20_000_000}}
    for name, d in files.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(d))
    (tmp_path / "deep.yaml").write_text("backbone: " + "[" * 5000 + "]" * 5000 + "\nhead: []\n")
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (tmp_path / "laughs.yaml").write_text("\n".join(laughs) + "\nbackbone: []\nhead: []\n")
    expected = {"inf": "width_multiple must be a finite number > 0, got inf", "anchors": "'anchors' is 20000000",
                "deep": "nests deeper than any configuration does", "laughs": "unfold to more than 1000000 values"}
    for name, words in expected.items():
        with pytest.raises(BadModelYaml, match=rf"^{re.escape(str(tmp_path / name))}\.yaml:.*{re.escape(words)}"):
            DetectionModel(str(tmp_path / f"{name}.yaml"))


def test_train_with_a_bad_cfg_exits_2_with_one_line(tmp_path, shapes_detect):
    cfg = tmp_path / "inf.yaml"
    d = yaml_model_load("yolov5n.yaml")
    d.pop("yaml_file")
    cfg.write_text(yaml.safe_dump({**d, "depth_multiple": float("inf")}))
    r = run_capped(["train.py", "--cfg", str(cfg), "--data", str(shapes_detect), "--epochs", "1", "--img", "64",
                    "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "r")])
    assert refused_once(r, "depth_multiple must be a finite number > 0, got inf"), r.stderr[-2000:]


OFFICIAL = ["yolov5x.yaml", "yolov5x-seg.yaml", "yolov5x-cls.yaml", "yolov5xu.yaml", "yolov7x.yaml", "yolov8x.yaml",
            "yolov8x-seg.yaml", "yolov8x-pose.yaml", "yolov8x-cls.yaml", "yolo11x-seg.yaml", "yolov8x-p2.yaml",
            "yolov5-p7.yaml", "yolov7-e6e.yaml"]


@pytest.mark.parametrize("cfg", OFFICIAL)
def test_the_largest_official_models_are_far_inside_the_budget(cfg):
    """Each family's largest model, at 640 px: under half the activation and work budget per input value, two thirds
    of the weights' bytes, and its weights and one 640 px image's activations within the memory a model may take
    (measured on the meta device, nothing allocated); YOLOv8x-P2 has the most activations and work per input value,
    YOLOv7-E6E the most weights (635 MiB) and memory (2.5 GiB)."""
    from models.yolo import BaseModel, parse_model

    d = yaml_model_load(cfg)
    check_cost(d, 3)
    with torch.device("meta"):
        layers, save = parse_model(d, 3)
    probe_model = BaseModel()
    probe_model.model, probe_model.save = layers, save
    side = 224 if "cls" in cfg else 640
    probe, _ = dry_run(lambda x: probe_model.eval()._forward_once(x, head=False), (1, 3, side, side))
    values = 3 * side * side
    assert probe.bytes / values < ACTIVATION_BYTES_PER_INPUT / 2 and probe.work / values < WORK_PER_INPUT / 2
    weight_bytes = 4 * sum(p.numel() for p in layers.parameters())
    assert weight_bytes < MAX_WEIGHT_BYTES * 2 / 3
    at_640, _ = dry_run(lambda x: probe_model.eval()._forward_once(x, head=False), (1, 3, 640, 640))
    assert weight_bytes + at_640.bytes < MAX_MODEL_BYTES * 0.85


def _classifier_yaml(path, *rows):
    path.write_text(yaml.safe_dump({"nc": 3, "backbone": [list(r) for r in rows], "head": [[-1, 1, "Classify", [3]]]}))
    return path


def test_a_model_yaml_is_budgeted_as_the_memory_it_takes(tmp_path, shapes_classify):
    """Issue 61: a 266-byte YAML within the old 500 M-weight bound took 2.88 GB, then ran out of memory. The budget is
    bytes: its weights as float32 (1 GiB), and those plus one 640 px image's activations (3 GiB); one 700-channel
    layer at full resolution is within the per-input-value bound and over the second."""
    heavy = _classifier_yaml(tmp_path / "heavy.yaml", (-1, 1, "Conv", [20000, 3, 2]), (-1, 1, "Conv", [2700, 3, 2]))
    wide = _classifier_yaml(tmp_path / "wide.yaml", (-1, 1, "Conv", [700, 3, 1]))
    assert heavy.stat().st_size < 300
    with pytest.raises(BadModelYaml, match=rf"describes 490772931 weights, 1.83 GiB as float32, more than the "
                                           rf"{MAX_WEIGHT_BYTES / 2**30:g} GiB"):
        check_cost(yaml_model_load(str(heavy)), 3)
    with pytest.raises(BadModelYaml, match=r"its weights and the activations of one 640x640 image take 3.\d\d GiB, "
                                           rf"more than the {MAX_MODEL_BYTES / 2**30:g} GiB a model may take"):
        check_cost(yaml_model_load(str(wide)), 3)
    r = run_capped(["classify/train.py", "--model", str(heavy), "--data", str(shapes_classify), "--device", "cpu",
                    "--img", "32", "--project", str(tmp_path / "r")])
    assert refused_once(r, "describes 490772931 weights"), r.stderr[-2000:]
    assert r.peak < 1 << 30
