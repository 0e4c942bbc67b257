"""Safe loading: no checkpoint, official weights file or resume file can run code, and legitimate files still load.

The malicious corpus is built here: each payload would create a marker file if anything executed it. Every entry
point must refuse every file with one line naming the file and the offending global, and the marker must not exist.
"""

import builtins
import collections
import functools
import os
import pickle
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from test_checkpoints import V5_PATHS, V8_PATHS, X, fp16_exact, save_official, v5_where, v8_where

import classify.predict
import detect
import segment.predict
import train
import val
from engine.checkpointer import strip_optimizer
from engine.options import DetectTrainOptions
from engine.resume import resume_opt
from models.checkpoints import (
    BadCheckpoint,
    UnsafeCheckpoint,
    allowed_global,
    attempt_load,
    from_safe,
    load_checkpoint,
    model_to_ckpt,
    safe,
    save_checkpoint,
    to_safe,
)
from models.untrusted import check_checkpoint
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from utils.files import ROOT


class Call:
    """Pickles as `fn(*args)`: the shape of every `__reduce__` payload. Callable only so that pickle accepts a
    Call as the function of another Call (the getattr chain); it is never called here."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args

    def __call__(self, *args):
        raise AssertionError("never called by the tests")


def payloads(marker):
    """name -> (object whose unpickling would create `marker`, the global the refusal must name)."""
    py = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": (Call(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        "exec": (Call(builtins.exec, py), "builtins.exec"),
        "eval": (Call(builtins.eval, py), "builtins.eval"),
        "Popen": (Call(subprocess.Popen, ["touch", str(marker)]), "subprocess.Popen"),
        "getattr": (Call(Call(builtins.getattr, Call(builtins.__import__, "os"), "system"), f"touch {marker}"),
                    "builtins.__import__"),
        "partial": (Call(functools.partial(os.system, f"touch {marker}")), "functools.partial"),
    }


def write(obj, path, fmt):
    if fmt == "pickle":
        path.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=fmt == "zip")
    return path


def our_checkpoint(model=None, **extra):
    model = model or DetectionModel("yolov5n.yaml", nc=3)
    return {"epoch": -1, "model": model_to_ckpt(model), "ema": None, "optimizer": None, "date": "2025", **extra}


@pytest.fixture
def no_unpickling(monkeypatch):
    """Refusals must come from reading the file, before torch builds anything from it."""
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load reached for a refused file"))


@pytest.mark.parametrize("fmt", ["pickle", "zip", "legacy"])
@pytest.mark.parametrize("kind", ["os.system", "exec", "eval", "Popen", "getattr", "partial"])
def test_payloads_refused_before_anything_runs(tmp_path, kind, fmt, no_unpickling):
    marker = tmp_path / "pwned"
    obj, name = payloads(marker)[kind]
    path = write(obj, tmp_path / "evil.pt", fmt)
    with pytest.raises(UnsafeCheckpoint) as e:
        attempt_load(path)
    assert str(e.value) == f"refusing {path}: it references {name}, which no model checkpoint needs"
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("force_unsafe", [False, True])
def test_unpickler_refuses_what_the_scan_would_miss(monkeypatch, tmp_path, fmt, force_unsafe):
    """Second line: with the static check of globals switched off, torch's weights_only unpickler itself still
    refuses the payload, and a legitimate official file still loads. Also under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1,
    which turns every torch.load that does not pass weights_only=True itself into a full unpickler (the peers' venv
    sets it for their own loaders)."""
    if force_unsafe:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    official = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model", edit=_extras)
    marker = tmp_path / "pwned"
    path = write(our_checkpoint(date=payloads(marker)["os.system"][0]), tmp_path / "best.pt", fmt)
    monkeypatch.setattr(safe, "_refuse_unsafe", lambda path, names: None)
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(official, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)
    with pytest.raises(BadCheckpoint, match="system"):
        attempt_load(path)
    assert not marker.exists()


def test_older_torch_loads_ours_and_refuses_official_trees(monkeypatch, tmp_path):
    """torch < 2.6 cannot admit the stand-ins by name: our checkpoints (torch's default types only) still load,
    official module trees are refused with a line saying why, never read another way."""
    monkeypatch.setattr(safe, "TORCH_SAFE_GLOBALS", False)
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    ours = write(our_checkpoint(model), tmp_path / "ours.pt", "zip")
    official = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model")
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(ours, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)
    with pytest.raises(BadCheckpoint, match=r"torch >= 2\.6"):
        attempt_load(official)


def test_getattr_reaches_only_official_stubs(monkeypatch, tmp_path):
    """Protocol-2 pickles write a function kept on a class (YOLOv5's `Segment.detect = Detect.forward`) as
    getattr(Detect, 'forward'): that loads. getattr on anything real is refused while unpickling."""
    model = fp16_exact(SegmentationModel("yolov5n-seg.yaml", nc=3))

    def detect_forward_attribute(tree):
        detect_cls = type(tree.model[-1])

        def forward(self, x):
            raise AssertionError("never called")

        forward.__module__, forward.__qualname__ = detect_cls.__module__, f"{detect_cls.__name__}.forward"
        detect_cls.forward = forward
        tree.model[-1].detect = detect_cls.forward

    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "SegmentationModel",
                         edit=detect_forward_attribute)
    assert "builtins.getattr" in check_checkpoint(path.read_bytes(), path, lambda names: None)
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(path, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)
    evil = write({"model": Call(Call(builtins.getattr, collections.OrderedDict, "fromkeys"), ["a"])},
                 tmp_path / "evil.pt", "zip")
    with pytest.raises(UnsafeCheckpoint, match=r"it calls getattr on collections\.OrderedDict"):
        attempt_load(evil)


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_payload_in_a_field_of_a_valid_checkpoint(tmp_path, fmt, no_unpickling):
    marker = tmp_path / "pwned"
    path = write(our_checkpoint(date=payloads(marker)["exec"][0]), tmp_path / "best.pt", fmt)
    with pytest.raises(UnsafeCheckpoint, match="builtins.exec"):
        load_checkpoint(path)
    assert not marker.exists()


def test_payload_in_an_official_module_tree(monkeypatch, tmp_path, no_unpickling):
    marker = tmp_path / "pwned"
    model = DetectionModel("yolov5n.yaml", nc=3)

    def plant(tree):
        tree.model[2].m[0].note = payloads(marker)["os.system"][0]

    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "DetectionModel", edit=plant)
    with pytest.raises(UnsafeCheckpoint, match=r"references posix\.system|references nt\.system"):
        attempt_load(path)
    assert not marker.exists()


def test_official_namespace_cannot_reach_real_code(tmp_path):
    """`models.*` / `utils.*` names become empty stubs, and no checkpoint calls one: a call to a real project function
    through them is refused before anything is built."""
    import utils.files

    marker = tmp_path / "pwned"
    path = write({"model": Call(utils.files.yaml_save, str(marker), {})}, tmp_path / "w.pt", "zip")
    with pytest.raises(UnsafeCheckpoint, match=r"it calls utils\.files\.yaml_save with arguments"):
        attempt_load(path)
    assert not marker.exists()


def test_damaged_files_are_user_errors(tmp_path):
    good = write(our_checkpoint(), tmp_path / "good.pt", "zip")
    data = good.read_bytes()
    for name, content in (("empty.pt", b""), ("text.pt", b"hello\n"), ("cut.pt", data[: len(data) // 2]),
                          ("random.pt", np.random.default_rng(0).bytes(4096))):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(BadCheckpoint, match=re.escape(str(tmp_path / name))):
            attempt_load(tmp_path / name)
    write({"weights": torch.ones(2)}, tmp_path / "dict.pt", "zip")
    with pytest.raises(BadCheckpoint, match="not a model checkpoint"):
        attempt_load(tmp_path / "dict.pt")


# ------------------------------------------------------------------ every entry point, in process
def _entry_points(weights, tmp_path, shapes_detect):
    out = ["--project", str(tmp_path / "out"), "--device", "cpu"]
    src = ["--source", str(ROOT / "data" / "images"), "--imgsz", "64"]
    return {
        "detect.py": lambda: detect.main(detect.parse_opt(["--weights", weights, *src, *out])),
        "segment/predict.py": lambda: segment.predict.main(
            segment.predict.parse_opt(["--weights", weights, *src, *out])),
        "classify/predict.py": lambda: classify.predict.main(
            classify.predict.parse_opt(["--weights", weights, *src, *out])),
        "val.py": lambda: val.main(val.parse_opt(["--weights", weights, "--data", str(shapes_detect), "--imgsz", "64",
                                                  "--workers", "0", *out])),
        "train.py --weights": lambda: train.main(train.parse_opt(
            ["--weights", weights, "--data", str(shapes_detect), "--imgsz", "64", "--epochs", "1", "--batch-size", "4",
             "--workers", "0", "--cfg", "yolov5n.yaml", *out])),
        "train.py --resume": lambda: train.main(train.parse_opt(["--resume", weights, "--device", "cpu"])),
    }


def test_every_entry_point_refuses(tmp_path, shapes_detect):
    marker = tmp_path / "pwned"
    corpus = payloads(marker)
    files = {
        "plain": write(corpus["eval"][0], tmp_path / "plain.pt", "pickle"),
        "zip": write(corpus["os.system"][0], tmp_path / "zip.pt", "zip"),
        "nested": write(our_checkpoint(opt={"x": corpus["getattr"][0]}), tmp_path / "nested.pt", "zip"),
    }
    for kind, path in files.items():
        for entry, call in _entry_points(str(path), tmp_path, shapes_detect).items():
            with pytest.raises(UnsafeCheckpoint, match=f"refusing {re.escape(str(path))}: it references"):
                call()
            assert not marker.exists(), (entry, kind)


def test_script_exits_with_the_refusal(tmp_path):
    """One whole process (the entry points above run in process): exit status 2, one error line, no marker."""
    marker = tmp_path / "pwned"
    path = write(our_checkpoint(date=payloads(marker)["os.system"][0]), tmp_path / "last.pt", "zip")
    cmd = [sys.executable, str(ROOT / "train.py"), "--resume", str(path), "--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = rf"^error: refusing {re.escape(str(path))}: it references (posix|nt)\.system, which no model checkpoint"
    assert len(re.findall(line + " needs$", r.stderr, re.M)) == 1, r.stderr[-2000:]
    assert not marker.exists()


# ------------------------------------------------------------------ legitimate files
def test_our_checkpoints_store_only_weights_only_types(tmp_path):
    state = np.random.RandomState(3).get_state()
    ckpt = our_checkpoint(rng={"numpy": state, "python": (3, (1, 2), None)}, metrics={"map": np.float64(0.5)},
                          opt={"data": tmp_path, "ns": SimpleNamespace(a=1)})
    with pytest.raises(TypeError, match=r"checkpoint\['rng'\]\['numpy'\]\[1\] is a numpy.ndarray"):
        save_checkpoint(ckpt, tmp_path / "raw.pt")
    save_checkpoint(to_safe(ckpt), tmp_path / "safe.pt")
    back = torch.load(tmp_path / "safe.pt", weights_only=True)  # torch's own check, no allowances
    assert back["opt"] == {"data": str(tmp_path), "ns": {"a": 1}} and back["metrics"] == {"map": 0.5}
    restored = from_safe(back["rng"])["numpy"]
    assert restored[0] == state[0] and restored[1].dtype == state[1].dtype and restored[2:] == state[2:]
    np.testing.assert_array_equal(restored[1], state[1])


def test_checkpoint_of_an_earlier_version_still_loads_resumes_and_strips(tmp_path):
    """Before this change the trainer pickled numpy RNG state and numpy metrics: such files load (with exactly the
    numpy reconstructors allowed), give the same outputs, and strip into the safe format."""
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    old = our_checkpoint(model, epoch=0, opt={"epochs": 3, "resume": False, "device": "cpu", "workers": 0},
                         rng={"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
                         metrics={"fitness": np.float64(0.25)}, best_fitness=np.float64(0.25),
                         optimizer={"state": {}, "param_groups": []})  # unfinished: --resume accepts it
    path = write(old, tmp_path / "last.pt", "zip")
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(path, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)
    ckpt = load_checkpoint(path)
    np.testing.assert_array_equal(ckpt["rng"]["numpy"][1], old["rng"]["numpy"][1])
    argv = ["--resume", str(path), "--device", "cpu", "--workers", "0"]
    opt, resume_from = resume_opt(DetectTrainOptions.from_values(train.parse_opt(argv).opt), "runs")
    assert opt.epochs == 3 and resume_from == path
    strip_optimizer(path)
    stripped = torch.load(path, weights_only=True)
    assert stripped["metrics"] == {"fitness": 0.25} and stripped["rng"] is None


V7_PATHS = ("models.yolo", "models.common")
PIP_PATHS = ("yolov5.models.yolo", "yolov5.models.common")


def pip_where(name):
    return "yolov5." + v5_where(name)


def _extras(tree):
    """What real official files carry besides the tree: numpy best_fitness (YOLOv7), options, git info, and the
    preprocessing Ultralytics classifiers keep as `model.transforms`."""
    tree.extras = {"best_fitness": np.array([0.5]), "opt": {"hyp": {"lr0": 0.01}}, "git": {"branch": "master"}}
    tree.transforms = T.Compose([T.Resize(64, interpolation=T.InterpolationMode.BILINEAR), T.CenterCrop(64),
                                 T.ToTensor(), T.Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))])


@pytest.mark.parametrize("family,make,paths,where,top", [
    ("yolov5 GitHub", lambda: SegmentationModel("yolov5n-seg.yaml", nc=3), V5_PATHS, v5_where, "SegmentationModel"),
    ("yolov5 pip", lambda: DetectionModel("yolov5n.yaml", nc=3), PIP_PATHS, pip_where, "DetectionModel"),
    ("yolov5 pip", lambda: SegmentationModel("yolov5n-seg.yaml", nc=3), PIP_PATHS, pip_where, "SegmentationModel"),
    ("yolov5 pip", lambda: ClassificationModel("yolov5n-cls.yaml", nc=4), PIP_PATHS, pip_where,
     "ClassificationModel"),
    ("yolov7", lambda: DetectionModel("yolov7-tiny.yaml", nc=3), V7_PATHS, v5_where, "Model"),
    ("yolov8", lambda: DetectionModel("yolov8n.yaml", nc=3), V8_PATHS, v8_where, "DetectionModel"),
    ("yolov8", lambda: ClassificationModel("yolov8n-cls.yaml", nc=3), V8_PATHS, v8_where, "ClassificationModel"),
])
def test_official_formats_load_with_the_same_outputs(monkeypatch, tmp_path, family, make, paths, where, top):
    model = fp16_exact(make())
    path = save_official(monkeypatch, tmp_path, model, paths, where, top, edit=_extras)
    loaded = attempt_load(path, fuse=False)
    assert type(loaded) is type(model)
    with torch.no_grad():
        a, b = loaded(X), model(X)
        torch.testing.assert_close(a[0] if isinstance(a, tuple) else a, b[0] if isinstance(b, tuple) else b,
                                   atol=0, rtol=0)


def test_pre_zip_files_load_through_the_restricted_loader_or_say_how_to_resave(monkeypatch, tmp_path):
    """Pre-1.6 (non-zip) files go through torch's weights_only unpickler like any other: ours (tensors and plain
    values) load; one that pickles whole modules, which that unpickler cannot read, is refused with how to
    re-save it where its code is trusted."""
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    ours = write(our_checkpoint(model), tmp_path / "ours.pt", "legacy")
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(ours, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)
    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model", legacy=True)
    with pytest.raises(UnsafeCheckpoint, match=r"pre-1\.6 torch file that pickles whole modules.*re-save it as a zip"):
        attempt_load(path)


@pytest.mark.parametrize("name", [
    "builtins.eval", "builtins.exec", "builtins.__import__", "builtins.open", "builtins.compile",
    "functools.partial", "functools.reduce", "subprocess.Popen", "subprocess.run", "os.system", "posix.system",
    "nt.system", "sys.modules", "runpy.run_path", "importlib.import_module", "pickle.loads", "shutil.rmtree",
    "webbrowser.open", "operator.attrgetter", "torch.load", "torch.hub.load", "numpy.load", "numpy.frombuffer",
    "collections.namedtuple", "yolov5.helpers.load_model", "ultralyticsx.evil", "modelsx.evil",
])
def test_payload_routes_are_not_on_the_allow_list(name):
    assert not allowed_global(name)


def test_pip_and_github_files_of_one_model_agree(monkeypatch, tmp_path):
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    (tmp_path / "gh").mkdir()
    (tmp_path / "pip").mkdir()
    gh = save_official(monkeypatch, tmp_path / "gh", model, V5_PATHS, v5_where, "DetectionModel")
    pip = save_official(monkeypatch, tmp_path / "pip", model, PIP_PATHS, pip_where, "DetectionModel")
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(pip)(X)[0], attempt_load(gh)(X)[0], atol=0, rtol=0)


def test_no_unsafe_loading_outside_the_checkpoint_loader():
    """The one place allowed to read pickles is models/checkpoints/safe.py (with models/untrusted.py, which reads them
    without building anything); everything else goes through it. Nothing anywhere, tests included, asks torch.load
    to unpickle without its restrictions, and torch.jit.load is reached only after check_torchscript."""
    pattern = re.compile(r"weights_only\s*=\s*False|allow_pickle\s*=\s*True|pickle\.loads?\(|torch\.load\(")
    offenders, unrestricted, jit = [], [], []
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        lines = list(enumerate(f.read_text().splitlines(), 1))
        unrestricted += [f"{rel}:{i}" for i, line in lines if re.search(r"weights_only\s*=\s*False", line)]
        jit += [f"{rel}:{i}" for i, line in lines if "jit.load(" in line and not rel.startswith("tests/")]
        if not rel.startswith("tests/") and rel not in ("models/checkpoints/safe.py", "models/untrusted.py"):
            offenders += [f"{rel}:{i}" for i, line in lines if pattern.search(line)]
    assert not offenders, f"unsafe loading outside models/checkpoints/safe.py: {offenders}"
    assert not unrestricted, f"unrestricted torch.load: {unrestricted}"
    assert len(jit) == 1 and jit[0].startswith("models/backend.py"), jit
