"""models/checkpoints.py: our checkpoint round trip, and loading official-style pickles without official code."""

import copy
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from models_testutil import assert_close_per_channel, randomise_bn

from models.checkpoints import (
    attempt_load,
    model_from_ckpt,
    model_to_ckpt,
    official_url,
    releases,
)
from models.checkpoints.ours import MODEL_CLASSES
from models.yolo import ClassificationModel, DetectionModel, PoseModel, SegmentationModel
from utils.errors import BadCheckpoint, BadFile
from utils.files import ROOT

X = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def fp16_exact(model, seed=0):
    """A model with random BN statistics whose weights survive fp16 storage exactly (so round trips are exact)."""
    torch.manual_seed(seed)
    return randomise_bn(model, seed).half().float().eval()


def first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize(
    "make",
    [
        lambda: DetectionModel("yolov5n.yaml", nc=3),
        lambda: DetectionModel("yolov8n.yaml", nc=3),
        lambda: SegmentationModel("yolov8n-seg.yaml", nc=3),
        lambda: ClassificationModel("yolov8n-cls.yaml", nc=3),
    ],
)
def test_ckpt_round_trip_through_torch_save(tmp_path, make):
    model = fp16_exact(make())
    model.names = {0: "a", 1: "b", 2: "c"}
    d = model_to_ckpt(model)
    assert d["class"] == type(model).__name__ and d["names"] == model.names and d["yaml"] == model.yaml
    assert all(v.dtype == torch.float16 for v in d["state_dict"].values() if v.is_floating_point())
    torch.save({"model": d}, tmp_path / "m.pt")
    back = model_from_ckpt(torch.load(tmp_path / "m.pt", weights_only=True)["model"]).eval()
    assert type(back) is type(model) and back.names == model.names
    assert all(p.dtype == torch.float32 for p in back.parameters())
    with torch.no_grad():
        torch.testing.assert_close(first(back(X)), first(model(X)), atol=0, rtol=0)


@pytest.mark.parametrize("names", [{0: "a", 5: "b", 9: "c"}, {0: "a"}, ["a", "b", "c", "d"]])
def test_names_that_miss_or_exceed_the_classes_are_refused(tmp_path, names):
    """Every script looks a predicted class up by its index: names with gaps loaded, then detect.py died on
    `KeyError: 2` at the first box of class 2."""
    model = DetectionModel("yolov5n.yaml", nc=3)
    torch.save({"model": {**model_to_ckpt(model), "names": names}}, tmp_path / "m.pt")
    with pytest.raises(BadCheckpoint, match=r"m\.pt: its model is malformed .*names must name classes 0-2"):
        attempt_load(tmp_path / "m.pt")


def test_attempt_load_prefers_ema_and_fuses(tmp_path):
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3), seed=0)
    ema = fp16_exact(DetectionModel("yolov5n.yaml", nc=3), seed=1)
    path = tmp_path / "last.pt"
    torch.save({"epoch": 3, "model": model_to_ckpt(model), "ema": model_to_ckpt(ema), "optimizer": None}, path)
    loaded = attempt_load(str(path), fuse=False)
    assert not loaded.training
    with torch.no_grad():
        torch.testing.assert_close(loaded(X)[0], ema(X)[0], atol=0, rtol=0)
        fused = attempt_load(path)
        assert not any(isinstance(m, nn.BatchNorm2d) for m in fused.modules())
        torch.testing.assert_close(fused(X)[0], ema(X)[0], atol=1e-3, rtol=1e-4)
    torch.save({"model": model_to_ckpt(model), "ema": None}, path)  # a stripped checkpoint
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(path, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)


def _fake_modules(monkeypatch, paths):
    """Install throwaway modules (and missing parent packages) in sys.modules for the test's duration."""
    for path in paths:
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name == path or name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))


def as_official(model, where, top_name):
    """A copy of our model tree whose classes are re-homed to fake official modules, as official pickles hold them.

    `where(cls_name)` gives the fake module path of each of our classes; the top model class is named top_name.
    """
    tree = copy.deepcopy(model)
    for m in tree.modules():
        if not type(m).__module__.startswith("models."):
            continue  # torch.nn classes stay what they are
        name = top_name if m is tree else type(m).__name__
        module = sys.modules[where(type(m).__name__)]
        if not hasattr(module, name):
            setattr(module, name, type(name, (nn.Module,), {"__module__": module.__name__, "__qualname__": name}))
        m.__class__ = getattr(module, name)
    return tree


V5_PATHS = ("models.yolo", "models.common")
V8_PATHS = ("ultralytics.nn.tasks", "ultralytics.nn.modules.block", "ultralytics.nn.modules.head")


def v5_where(name):
    return "models.yolo" if name.endswith(("Model", "Detect", "Segment")) else "models.common"


def v8_where(name):
    if name.endswith("Model"):
        return "ultralytics.nn.tasks"
    return "ultralytics.nn.modules.head" if name in ("AnchorFreeDetect", "Classify") else "ultralytics.nn.modules.block"


def save_official(monkeypatch, tmp_path, model, paths, where, top_name, key="model", edit=None, legacy=False):
    """Pickle `model` as an official checkpoint would (whole fp16 module tree), then drop the fake modules.
    legacy: the pre-1.6 torch format (not a zip) of the oldest official releases."""
    with monkeypatch.context() as mp:
        _fake_modules(mp, paths)
        tree = as_official(model, where, top_name).half()
        if edit:
            edit(tree)
        path = tmp_path / "official.pt"
        ckpt = {"epoch": -1, "model": None, "ema": None, key: tree, "optimizer": None}
        with warnings.catch_warnings():  # the legacy format looks for the classes' source, these have none
            warnings.simplefilter("ignore")
            torch.save(ckpt, path, _use_new_zipfile_serialization=not legacy)
    assert type(sys.modules["models.yolo"].DetectionModel) is type  # the real module is back
    return path


def test_official_v5_style_pickle(monkeypatch, tmp_path):
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))

    def legacy(tree):  # old YOLOv5 pickles: `names` a list, an extra anchor_grid buffer
        tree.names = ["a", "b", "c"]
        tree.model[-1].register_buffer("anchor_grid", torch.zeros(3, 1, 3, 1, 1, 2))

    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model", edit=legacy)
    loaded = attempt_load(path, fuse=False)
    assert type(loaded) is DetectionModel and loaded.names == {0: "a", 1: "b", 2: "c"}
    with torch.no_grad():
        torch.testing.assert_close(loaded(X)[0], model(X)[0], atol=0, rtol=0)


def test_official_v8_style_pickle_keeps_batchnorm_settings(monkeypatch, tmp_path):
    model = fp16_exact(ClassificationModel("yolov8n-cls.yaml", nc=4))

    def official_yaml(tree):  # the official YAML has no bn keys: eps 1e-5 must come from the pickled BatchNorms
        tree.yaml = {k: v for k, v in tree.yaml.items() if not k.startswith("bn_")}

    path = save_official(monkeypatch, tmp_path, model, V8_PATHS, v8_where, "ClassificationModel", "ema", official_yaml)
    loaded = attempt_load(path, fuse=False)
    assert type(loaded) is ClassificationModel and loaded.model[0].bn.eps == 1e-5
    with torch.no_grad():
        torch.testing.assert_close(loaded(X), model(X), atol=0, rtol=0)


def test_official_v8_segmentation_pickle(monkeypatch, tmp_path):
    model = fp16_exact(SegmentationModel("yolov8n-seg.yaml", nc=3))
    path = save_official(monkeypatch, tmp_path, model, V8_PATHS, v8_where, "SegmentationModel")
    loaded = attempt_load(path, fuse=False)
    assert type(loaded) is SegmentationModel
    with torch.no_grad():
        torch.testing.assert_close(loaded(X)[0], model(X)[0], atol=0, rtol=0)


def test_official_v5_classifier_without_yaml(monkeypatch, tmp_path):
    model = fp16_exact(ClassificationModel("yolov5n-cls.yaml", nc=4))

    def no_yaml(tree):  # official YOLOv5 classifiers are cut from a detector and carry no YAML
        del tree.yaml

    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "ClassificationModel", edit=no_yaml)
    loaded = attempt_load(path, fuse=False)
    assert loaded.yaml["width_multiple"] == 0.25 and loaded.nc == 4
    with torch.no_grad():
        torch.testing.assert_close(loaded(X), model(X), atol=0, rtol=0)


def test_every_model_class_of_models_yolo_loads_from_our_checkpoints():
    """The classes our checkpoints may name are found in models/yolo.py, not listed: a new task's model class cannot
    be left out (its checkpoints would all be refused)."""
    import models.yolo
    from engine.tasks import TASKS

    defined = {c.__name__: c for c in vars(models.yolo).values()  # by class name: `Model` is DetectionModel's alias
               if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == "models.yolo"}
    assert MODEL_CLASSES == {n: c for n, c in defined.items() if n != "BaseModel"} and len(MODEL_CLASSES) == 5
    assert all(MODEL_CLASSES[t.model.__name__] is t.model for t in TASKS.values())


@pytest.mark.parametrize("kind", ["Elsewhere", "BaseModel", "Module"])
def test_a_checkpoint_naming_a_class_we_do_not_define_is_refused(tmp_path, kind):
    """A subclass of our models made elsewhere (here, by this test) is not one a checkpoint may name."""

    class Elsewhere(DetectionModel):
        pass

    model = Elsewhere("yolov5n.yaml", nc=3)
    torch.save({"model": {**model_to_ckpt(model), "class": kind}}, tmp_path / "m.pt")
    assert model_to_ckpt(model)["class"] == "Elsewhere"
    with pytest.raises(BadCheckpoint, match="its model entry is not one this project wrote"):
        attempt_load(tmp_path / "m.pt")


def test_unknown_official_class(monkeypatch, tmp_path):
    model = DetectionModel("yolov5n.yaml", nc=3)
    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "WorldModel")  # Ultralytics', not ours
    with pytest.raises(ValueError, match="models.yolo.WorldModel"):
        attempt_load(path)


def test_missing_weights(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadFile, match="nowhere/yolov5s.pt"):
        attempt_load("nowhere/yolov5s.pt")  # a path, not a bare name: never downloaded
    with pytest.raises(BadFile, match="yolov5q.pt"):
        attempt_load("yolov5q.pt")  # not an official name
    calls = []

    def fake_download(name, dest_dir="."):
        calls.append(name)
        torch.save({"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=2))}, tmp_path / name)
        return tmp_path / name

    monkeypatch.setattr(releases, "attempt_download", fake_download)
    assert attempt_load("yolov5s.pt").nc == 2 and calls == ["yolov5s.pt"]


def test_official_urls():
    assert official_url("yolov5s.pt") == "https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5s.pt"
    assert official_url("yolov5n-seg.pt").endswith("v7.0/yolov5n-seg.pt")
    assert official_url("yolov7-tiny.pt") == "https://github.com/WongKinYiu/yolov7/releases/download/v0.1/yolov7-tiny.pt"
    assert official_url("yolov8n-cls.pt") == "https://github.com/ultralytics/assets/releases/download/v0.0.0/yolov8n-cls.pt"
    assert official_url("yolov5nu.pt") == "https://github.com/ultralytics/assets/releases/download/v8.2.0/yolov5nu.pt"
    assert official_url("yolo11n-seg.pt") == "https://github.com/ultralytics/assets/releases/download/v8.3.0/yolo11n-seg.pt"
    assert official_url("yolov5x6.pt").endswith("v7.0/yolov5x6.pt")
    assert official_url("yolov8q.pt") is None and official_url("best.pt") is None and official_url("yolo11.pt") is None


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_ultralytics_saved_pose_checkpoint():
    """A pose checkpoint the official package saved itself (fixtures/make_pose_checkpoint.py) loads through the safe
    loader as our PoseModel, with its kpt_shape, and gives the official eval output, fused or not."""
    ref = torch.load(FIXTURES / "ultralytics-pose-tiny.out.pt", weights_only=True)
    x = ref["x"].float() / 255
    for fuse in (False, True):
        model = attempt_load(FIXTURES / "ultralytics-pose-tiny.pt", fuse=fuse)
        assert type(model) is PoseModel and model.kpt_shape == (5, 3) and model.nc == 1
        with torch.no_grad():
            assert_close_per_channel(model(x)[0], ref["y"])


def test_loading_a_v8_checkpoint_does_not_import_the_compiler(tmp_path):
    """The size check builds the layers on the meta device, where a DFL's bins made there would go through
    torch._refs and import torch._dynamo: most of a second added to every predict, val and export command."""
    torch.save({"model": model_to_ckpt(DetectionModel("yolov8n.yaml", nc=3))}, tmp_path / "m.pt")
    code = ("import sys; from models.checkpoints import attempt_load; attempt_load(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run(["timeout", "300", sys.executable, "-c", code, str(tmp_path / "m.pt")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "False"


@pytest.mark.parametrize("cfg", ["yolov8n.yaml", "yolov5n.yaml", "yolov7-tiny.yaml"])
def test_fine_tuning_keeps_the_weights_of_classes_named_alike(cfg):
    """A head for another class count: the classes both models name alike give the source's scores, in the new
    order; the rest of the outputs (boxes, objectness) are the source's too, and a class it never had starts new."""
    from models.checkpoints import transfer_weights
    from models.yolo import DetectionModel

    torch.manual_seed(0)
    src = DetectionModel(cfg, nc=6)
    src.names = dict(enumerate("abcdef"))
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # no two classes alike
    dst = DetectionModel(cfg, nc=3)
    dst.names = {0: "c", 1: "new", 2: "a"}
    head = dst.model[-1]
    name = next(iter(head.class_rows()))
    key = f"model.{len(dst.model) - 1}.{name}"
    dim, rows, _ = head.class_rows()[name]
    fresh = dst.state_dict()[key].index_select(dim, torch.tensor(rows(1)))
    transfer_weights(dst, src, "src.pt")
    x = torch.rand(1, 3, 64, 64)
    y_src, y_dst = src.eval()(x)[0], dst.eval()(x)[0]
    if cfg == "yolov8n.yaml":  # (B, 4 + nc, anchors) -> (B, anchors, 4 + nc)
        y_src, y_dst = y_src.transpose(1, 2), y_dst.transpose(1, 2)
    k = 4 if cfg == "yolov8n.yaml" else 5  # box (and objectness) channels before the classes
    torch.testing.assert_close(y_dst[..., :k], y_src[..., :k])
    torch.testing.assert_close(y_dst[..., k + 0], y_src[..., k + 2])  # "c"
    torch.testing.assert_close(y_dst[..., k + 2], y_src[..., k + 0])  # "a"
    assert not any(torch.allclose(y_dst[..., k + 1], y_src[..., k + c]) for c in range(6))
    torch.testing.assert_close(dst.state_dict()[key].index_select(dim, torch.tensor(rows(1))), fresh)


def test_fine_tuning_a_classifier_keeps_the_classes_named_alike():
    from models.checkpoints import transfer_weights
    from models.yolo import ClassificationModel

    torch.manual_seed(0)
    src = ClassificationModel("yolov8n-cls.yaml", nc=4)
    src.names = ["cat", "dog", "cow", "fox"]  # a list, as some checkpoints hold them
    dst = ClassificationModel("yolov8n-cls.yaml", nc=2)
    dst.names = {0: "fox", 1: "cat"}
    transfer_weights(dst, src, "src.pt", exclude=())
    logits = []
    for m in (src, dst):
        m.model[-1].linear.register_forward_hook(lambda mod, i, out: logits.append(out))
        m.eval()(torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(logits[1], logits[0][:, [3, 0]])


def test_fine_tuning_the_same_classes_in_another_order_follows_the_names():
    from models.checkpoints import transfer_weights
    from models.yolo import DetectionModel

    torch.manual_seed(0)
    src = DetectionModel("yolov8n.yaml", nc=3)
    src.names = {0: "cat", 1: "dog", 2: "cow"}
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    dst = DetectionModel("yolov8n.yaml", nc=3)
    dst.names = {0: "dog", 1: "cow", 2: "cat"}
    transfer_weights(dst, src, "src.pt")
    x = torch.rand(1, 3, 64, 64)
    y_src, y_dst = src.eval()(x)[0], dst.eval()(x)[0]
    torch.testing.assert_close(y_dst[:, :4], y_src[:, :4])
    torch.testing.assert_close(y_dst[:, 4:], y_src[:, 4:][:, [1, 2, 0]])


@pytest.mark.parametrize("src_cfg, src_nc", [("yolov8n.yaml", 80), ("yolov5n.yaml", 6)])
def test_no_class_weights_carry_over_where_the_rest_of_the_head_differs(src_cfg, src_nc):
    """yolov8n's class branch is max(64, nc) wide, so an 80-class head shares nothing with a 3-class one; a v5 head
    into a v8 model shares nothing either: the class rows stay as initialised."""
    from models.checkpoints import transfer_weights
    from models.yolo import DetectionModel

    src = DetectionModel(src_cfg, nc=src_nc)
    src.names = {i: f"class{i}" for i in range(src_nc)}
    dst = DetectionModel("yolov8n.yaml", nc=3)
    dst.names = {0: "class2", 1: "class0", 2: "other"}
    before = {k: v.clone() for k, v in dst.state_dict().items() if ".cv3." in k}
    transfer_weights(dst, src, "src.pt")
    after = dst.state_dict()
    assert [k for k, v in before.items() if not torch.equal(after[k], v)] == []


LIKE = re.compile(r"its YAML names none; its layers are those of models/(\S+\.yaml)( \(and \d+ more\))?, "
                  r"which names it")


@pytest.mark.parametrize("name, hyp", [
    ("ultralytics-v8t-shapes.pt", "hyp.v8.yaml"),  # `yolo detect train` wrote it
    ("ultralytics-cls-t.pt", "hyp.cls.yaml"),
    ("ultralytics-pose-tiny.pt", "hyp.v8.yaml"),
    ("yolov5-trained-tiny.pt", "hyp.scratch-low.yaml"),  # `yolov5 train` wrote it
])
def test_peer_saved_checkpoints_take_their_family_hyp_file(name, hyp):
    """A checkpoint a peer trained holds the YAML it was built from, which names no hyp file: the file follows its
    layers (engine/hyp.default_hyp_file), those of the YAML here it names. With the v5 file a v8 model failed at once
    ('dfl' is missing)."""
    from engine.hyp import default_hyp_file
    from models.yolo import yaml_model_load

    d = attempt_load(FIXTURES / name, fuse=False).yaml
    file, why = default_hyp_file(d)
    ours = yaml_model_load(LIKE.fullmatch(why).group(1))
    assert file == hyp == ours["hyp"] and (ours["backbone"], ours["head"]) == (d["backbone"], d["head"])


def test_official_yolov7_tiny_pickle_takes_the_tiny_hyp_file(monkeypatch, tmp_path):
    """yolov7 and yolov7-tiny end in the same IDetect head and train with different files; an official pickle's YAML
    (the yolov7 repo's cfg/training file: its layers are ours, its anchors its own) names neither."""
    from engine.hyp import default_hyp_file
    from models.yolo import yaml_model_load

    cfg = {k: v for k, v in yaml_model_load("yolov7-tiny.yaml").items() if k not in ("hyp", "yaml_file")}
    cfg["anchors"] = [[9, 6, 13, 16, 29, 11], [29, 28, 66, 26, 51, 62], [115, 54, 134, 119, 308, 147]]
    cfg["width_multiple"] = 0.25  # the same layers, a quarter of the channels: the test builds and pickles it
    path = save_official(monkeypatch, tmp_path, DetectionModel(cfg, nc=3), V5_PATHS, v5_where, "Model")
    assert default_hyp_file(attempt_load(path, fuse=False).yaml)[0] == "hyp.v7-tiny.yaml"
    cfg = {k: v for k, v in yaml_model_load("yolov7.yaml").items() if k not in ("hyp", "yaml_file")}
    assert default_hyp_file(cfg)[0] == "hyp.v7.yaml"
