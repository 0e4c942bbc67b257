"""No file runs code, against an attacker who has read the loader (models/untrusted.py, models/checkpoints.py).

The corpus (untrusted_corpus.py) is built here: a scripted module whose `__setstate__` writes a file, that archive
disguised as a checkpoint, a pre-1.6 file whose BUILD and module persistent id would make torch's legacy loader
write a `.patch` file, duplicate data.pkl records, and files of a few hundred bytes that claim gigabytes. Every
entry point must refuse each of them with one `error:` line and exit status 2, and no marker may appear.
"""

import importlib
import os
import re
import subprocess
import sys
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath, PureWindowsPath
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import untrusted_corpus as corpus
from models_testutil import save_checkpoint
from test_checkpoints import V5_PATHS, X, fp16_exact, save_official, v5_where

import hubconf
from engine.exporter import Exporter
from models.backend import InferenceBackend
from models.checkpoints import UnsafeCheckpoint, attempt_load, load_checkpoint, model_to_ckpt
from models.untrusted import TORCHSCRIPT_OPS, UnsafeTorchScript, check_torchscript
from models.yolo import ClassificationModel, DetectionModel, OBBModel, PoseModel, SegmentationModel
from utils.errors import BadCheckpoint, BadFile, UserError
from utils.files import ROOT
from utils.run import run_cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> path of every hostile file; `marker` the file any payload would create."""
    d = tmp_path_factory.mktemp("corpus")
    marker = d / "pwned"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice, zipfile's duplicate-name note
        ts = corpus.scripted_writer(d / "evil.torchscript", marker)
        out = {"torchscript": ts, **{f"disguised, {k}": v for k, v in corpus.disguised(ts, d).items()}}
    (d / "legacy.pt").write_bytes(corpus.legacy_build_patch(d / "pwned"))
    (d / "claim_legacy.pt").write_bytes(corpus.legacy_claim(1 << 30))
    out.update({"legacy BUILD + module id": d / "legacy.pt", "legacy 2 GiB claim": d / "claim_legacy.pt",
                "zip 64 GiB claim": corpus.zip_claim(d / "claim_zip.pt", 16 << 30)})
    return SimpleNamespace(paths=out, marker=marker, folder=d)


def no_payload_ran(files):
    left = [p.name for p in files.folder.iterdir() if p.name == "pwned" or p.suffix == ".patch"]
    return not left and not list(ROOT.glob("*.patch"))


def test_the_corpus_is_live(files, tmp_path):
    """Without the checks, torch.jit.load runs the payload (so the refusals below can fail)."""
    marker = tmp_path / "ran"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = corpus.scripted_writer(tmp_path / "live.torchscript", marker)
        torch.jit.load(str(corpus.rezip(path, tmp_path / "live.pt", tail=b"\0" * 7)))
    assert marker.exists()


def test_every_hostile_file_is_refused_by_both_loaders(files, tmp_path):
    """Each file as a checkpoint (load_checkpoint) and as a TorchScript file (the backend's .torchscript path)."""
    for name, path in files.paths.items():
        with pytest.raises(UnsafeCheckpoint, match=rf"^refusing {re.escape(str(path))}: "):
            load_checkpoint(path)
        as_ts = tmp_path / f"{path.stem}.torchscript"
        as_ts.write_bytes(path.read_bytes())
        with pytest.raises(BadFile, match=r"refusing|not a TorchScript archive"):
            InferenceBackend(as_ts)
    with pytest.raises(UnsafeTorchScript, match=r"a method __getstate__, where traced modules define only forward"):
        check_torchscript(files.paths["torchscript"].read_bytes(), "evil")
    assert no_payload_ran(files)


@pytest.mark.parametrize("first", ["harmless", "payload"])
def test_two_data_pkl_records_in_either_order(tmp_path, first):
    good = tmp_path / "good.pt"
    torch.save({"model": None}, good)
    top = zipfile.ZipFile(good).namelist()[0].split("/")[0]
    evil = b"\x80\x02cbuiltins\neval\nX\x03\x00\x00\x001+1\x85R."  # eval('1+1')
    pair = [(f"{top}/data.pkl", data) for data in (zipfile.ZipFile(good).read(f"{top}/data.pkl"), evil)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = corpus.rezip(good, tmp_path / "dup.pt", extra=pair if first == "harmless" else pair[::-1])
    with pytest.raises(UnsafeCheckpoint, match="two records named 'data.pkl'"):
        load_checkpoint(path)


def test_appended_bytes_change_nothing_torch_reads(tmp_path):
    """Bytes after a real checkpoint: torch and the checks read the same records, so it loads the same model. A
    second end-of-archive record appended makes torch's reader see another (here empty) archive: so do the checks,
    and the file is refused as unreadable."""
    path = save_checkpoint("yolov5n.yaml", DetectionModel, tmp_path / "m.pt")
    tailed, second_end = tmp_path / "tailed.pt", tmp_path / "second_end.pt"
    tailed.write_bytes(path.read_bytes() + b"appended by someone" * 3)
    second_end.write_bytes(path.read_bytes() + b"PK\x05\x06" + b"\0" * 18)
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(tailed, fuse=False)(X)[0], attempt_load(path, fuse=False)(X)[0])
    with pytest.raises(BadCheckpoint, match="not a readable checkpoint"):
        attempt_load(second_end)


def test_claims_of_gigabytes_are_refused_under_1_gib(files, tmp_path):
    """Sub-kilobyte files claiming gigabytes, a stride-0 view describing a gigabyte, and a model YAML describing
    gigabytes of weights: refused before allocation, with peak memory (a fresh process) under 1 GiB."""
    for name in ("legacy 2 GiB claim", "zip 64 GiB claim"):
        assert files.paths[name].stat().st_size < 1024, name
    paths = [files.paths["legacy 2 GiB claim"], files.paths["zip 64 GiB claim"],
             corpus.expanded_view(tmp_path / "expanded.pt", 1 << 30), corpus.yaml_blowup(tmp_path / "wide.pt")]
    load = "\n".join([
        "import sys",
        "from models.checkpoints import attempt_load",
        "from utils.errors import BadCheckpoint",
        "for p in sys.argv[1:]:",
        "    try:",
        "        attempt_load(p)",
        "    except BadCheckpoint as e:",
        "        print('refused', e, flush=True)",
    ])
    # Linux keeps a process's peak across exec, so a child started by this (large) test process would report this
    # process's peak: a small Python starts the loader and reads its children's peak instead
    measure = ("import resource, subprocess, sys\n"
               "subprocess.run([sys.executable, '-c', sys.argv[1], *sys.argv[2:]], check=True)\n"
               "print('peak_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", measure, load, *map(str, paths)], capture_output=True, text=True,
                       timeout=180, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("refused") == len(paths), r.stdout
    assert "describes 7" in r.stdout and "claims 68719476736 bytes" in r.stdout, r.stdout
    peak = int(re.search(r"peak_kib (\d+)", r.stdout).group(1)) * 1024
    assert peak < 1 << 30, f"peak {peak / 2 ** 20:.0f} MiB"


# ------------------------------------------------------------------ TorchScript: what export.py writes, nothing else
FAMILIES = [("yolov5n.yaml", DetectionModel), ("yolov5n-seg.yaml", SegmentationModel),
            ("yolov5n-cls.yaml", ClassificationModel), ("yolov7-tiny.yaml", DetectionModel),
            ("yolov8n.yaml", DetectionModel), ("yolov8n-seg.yaml", SegmentationModel),
            ("yolov8n-cls.yaml", ClassificationModel), ("yolo11n-pose.yaml", PoseModel),  # attention, slices to the end
            ("yolov3-tiny.yaml", DetectionModel), ("yolov5s-transformer.yaml", DetectionModel),  # padding; bmm
            ("yolov8n-obb.yaml", OBBModel)]  # cos, sin


def _export(weights, dynamic=True):
    opt = SimpleNamespace(weights=str(weights), include=["torchscript"], imgsz=[64], batch_size=1, device="cpu",
                          half=False, dynamic=dynamic, simplify=False, opset=17)
    return Exporter(opt)()[0]


@pytest.mark.parametrize("cfg,cls", FAMILIES, ids=[c for c, _ in FAMILIES])
def test_every_exported_family_passes_the_check(tmp_path, cfg, cls):
    """Fails when the exporter starts writing an operator TORCHSCRIPT_OPS does not list, or one the dry run cannot
    size (utils/dry_run.py): loaded, dry-run at its exported size and run at another."""
    ts = _export(save_checkpoint(cfg, cls, tmp_path / "m.pt"))
    check_torchscript(ts.read_bytes(), ts)
    InferenceBackend(ts)(torch.zeros(1, 3, 64, 96))


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    ts = _export(save_checkpoint("yolov8n-cls.yaml", ClassificationModel, d / "m.pt"), dynamic=False)
    z = zipfile.ZipFile(ts)
    top = next(n for n in z.namelist() if "/code/" in n and n.endswith(".py") and "def forward" in z.read(n).decode())
    return SimpleNamespace(path=ts, code=top, text=z.read(top).decode(), folder=d)


def _before_return(line):
    return lambda text: text.replace("    return ", f"    {line}\n    return ", 1)


EDITS = {
    "a file-writing operator": _before_return('_0 = torch.from_file("x", True, 8)'),
    "__setstate__": lambda t: t + "  def __setstate__(self, state: Tuple[bool]) -> NoneType:\n    return None\n",
    "an import": lambda t: "import os\n" + t,
    "torch rebound": _before_return("torch = self.training"),
    "getattr on torch": _before_return('_0 = getattr(torch, "from_file")("x")'),
    "a method call": _before_return('_0 = (self).save("x")'),
    "a loop": _before_return("for _i in range(3):\n      pass"),
    "a decorated class": lambda t: "@torch.jit.script\n" + t,
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_torchscript_code_beyond_the_exporter_is_refused(export, edit):
    edited = corpus.rezip(export.path, export.folder / f"{edit}.torchscript",
                          replace={export.code: EDITS[edit](export.text).encode()})
    with pytest.raises(UnsafeTorchScript, match=r"^refusing .*: its code code/.* holds "):
        check_torchscript(edited.read_bytes(), edited)


def test_torchscript_pickles_and_members_beyond_the_exporter_are_refused(export):
    top = export.code.split("/")[0]
    evil_pickle = b"\x80\x02cbuiltins\neval\nX\x03\x00\x00\x001+1\x85R."
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = {
            "references builtins.eval": corpus.rezip(export.path, export.folder / "c.torchscript",
                                                     replace={f"{top}/constants.pkl": evil_pickle}),
            "not TorchScript source": corpus.rezip(export.path, export.folder / "so.torchscript",
                                                   extra=[(f"{top}/code/__torch__/evil.so", b"\x7fELF")]),
            "model.json": corpus.rezip(export.path, export.folder / "json.torchscript",
                                       extra=[(f"{top}/model.json", b"{}")]),
        }
    for words, path in cases.items():
        with pytest.raises(UnsafeTorchScript, match=words):
            check_torchscript(path.read_bytes(), path)
    assert "torch.from_file" not in TORCHSCRIPT_OPS and "torch.save" not in TORCHSCRIPT_OPS


# ------------------------------------------------------------------ harmless data and malformed trees
def test_official_opt_with_paths_loads(monkeypatch, tmp_path):
    """Official `opt` dicts may hold pathlib paths; building one runs no code, so they load (as pure paths)."""
    from pathlib import PosixPath

    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))

    def paths(tree):
        tree.opt = {"save_dir": PosixPath("/runs/exp"), "data": PureWindowsPath("C:/data/coco.yaml")}

    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model", edit=paths)
    ckpt = load_checkpoint(path)
    assert vars(ckpt["model"])["opt"] == {"save_dir": PurePosixPath("/runs/exp"),
                                          "data": PureWindowsPath("C:/data/coco.yaml")}
    with torch.no_grad():
        torch.testing.assert_close(attempt_load(path, fuse=False)(X)[0], model(X)[0], atol=0, rtol=0)


def _hook_called(*args):
    raise AssertionError("a hook stored in the file was called")


MALFORMED = {
    "no _parameters": lambda tree: vars(tree.model[0].conv).pop("_parameters"),
    "a submodule that is a string": lambda tree: vars(tree.model)["_modules"].__setitem__("0", "conv"),
    "names of objects": lambda tree: setattr(tree, "names", {0: torch.zeros(1)}),
    "BatchNorm eps a string": lambda tree: setattr(tree.model[0].bn, "eps", "0.001"),
    "a state-dict hook": lambda tree: vars(tree)["_state_dict_hooks"].__setitem__(0, torch.Size),
}


@pytest.mark.parametrize("edit", list(MALFORMED))
def test_malformed_official_trees_are_bad_checkpoints(monkeypatch, tmp_path, edit):
    """Whatever a file's tree holds in place of a module is one BadCheckpoint line, never a KeyError traceback; hooks
    stored in the tree are never called (the tree is read from its dicts)."""
    model = fp16_exact(DetectionModel("yolov5n.yaml", nc=3))
    path = save_official(monkeypatch, tmp_path, model, V5_PATHS, v5_where, "Model", edit=MALFORMED[edit])
    if edit == "a state-dict hook":
        attempt_load(path)  # torch.Size(tree, ...) would raise: the hook is not called
        return
    with pytest.raises(BadCheckpoint, match=rf"^{re.escape(str(path))}: its model is malformed"):
        attempt_load(path)


# ------------------------------------------------------------------ every entry point
def _argv(entry, weights, out, data):
    if entry == "train.py --resume":
        return ["--resume", str(weights), "--device", "cpu"]
    common = ["--weights", str(weights), "--project", str(out), "--device", "cpu"]
    src = ["--source", str(ROOT / "data" / "images"), "--imgsz", "64"]
    val = ["--imgsz", "64", "--workers", "0"]
    return {
        "detect.py": [*src, *common],
        "segment/predict.py": [*src, *common],
        "classify/predict.py": [*src, *common],
        "val.py": ["--data", str(data.detect), *val, *common],
        "segment/val.py": ["--data", str(data.segment), *val, *common],
        "train.py --weights": ["--data", str(data.detect), *val, "--epochs", "1", "--batch-size", "4", "--cfg",
                               "yolov5n.yaml", *common],
        "export.py": ["--weights", str(weights), "--include", "torchscript", "--imgsz", "64"],
    }[entry]


ENTRIES = ["detect.py", "segment/predict.py", "classify/predict.py", "val.py", "segment/val.py", "train.py --weights",
           "export.py", "train.py --resume"]
SAMPLE = ["torchscript", "disguised, appended bytes", "legacy BUILD + module id", "zip 64 GiB claim"]


def test_every_entry_point_refuses_every_kind(files, tmp_path, shapes_detect, shapes_segment, capsys):
    data = SimpleNamespace(detect=shapes_detect, segment=shapes_segment)
    for entry in ENTRIES:
        script = importlib.import_module(entry.split()[0].removesuffix(".py").replace("/", "."))
        for kind in SAMPLE:
            weights = files.paths[kind]
            argv = _argv(entry, weights, tmp_path / "out", data)
            with pytest.raises(SystemExit) as e:
                run_cli(script.main, lambda: script.parse_opt(argv))
            out = capsys.readouterr()
            errors = [line for line in out.err.splitlines() if line.startswith("error: ")]
            assert e.value.code == 2 and len(errors) == 1 and "refusing" in errors[0], (entry, kind, out.err[-1500:])
            assert "Traceback" not in out.out + out.err and no_payload_ran(files), (entry, kind)
        # torch.hub.load(repo, "custom", path=...) calls this; a .torchscript goes to the export loader's own check
        kind = SAMPLE[ENTRIES.index(entry) % len(SAMPLE)]
        with pytest.raises(UnsafeTorchScript if kind == "torchscript" else UnsafeCheckpoint, match="^refusing"):
            hubconf.custom(files.paths[kind])
    assert no_payload_ran(files)


def test_scripts_exit_2_with_one_line(files, tmp_path):
    """Whole processes, run at once: exit status 2, one error line naming the file, no traceback, no payload."""
    runs = {
        "detect.py": ["--weights", str(files.paths["torchscript"]), "--source", str(ROOT / "data" / "images")],
        "export.py": ["--weights", str(files.paths["disguised, appended bytes"]), "--include", "torchscript"],
        "train.py": ["--resume", str(files.paths["legacy BUILD + module id"])],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(script):
        cmd = [sys.executable, str(ROOT / script), *runs[script], "--device", "cpu"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)

    with ThreadPoolExecutor(len(runs)) as pool:
        results = dict(zip(runs, pool.map(run, runs)))
    for script, r in results.items():
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr, (script, r.stderr[-2000:])
        assert len(errors) == 1 and errors[0].startswith("error: refusing "), (script, errors)
    assert no_payload_ran(files) and not list(tmp_path.glob("*.patch"))


# ------------------------------------------------------------------ structures that cost more than their bytes
def _contains_itself():
    loop = []
    loop.append(loop)
    return loop


def _laughs(levels=40):
    x = ["lol"]
    for _ in range(levels):
        x = [x, x]
    return x


def _deep(levels=200):
    x = []
    for _ in range(levels):
        x = [x]
    return x


@pytest.mark.parametrize("words,make", [("contains itself", _contains_itself), ("unfold to more", _laughs),
                                        ("nests deeper", _deep)])
def test_structures_that_cost_more_than_their_bytes(tmp_path, words, make):
    """A few kilobytes of memo references can describe a self-containing list (recursion in any walk of it) or 2^40
    values (any repr or copy of it): refused on loading, before the trainer or an error message walks it."""
    path = tmp_path / "c.pt"
    torch.save({**corpus.our_checkpoint(), "opt": make()}, path)
    with pytest.raises(UnsafeCheckpoint, match=words):
        load_checkpoint(path)


def test_a_model_yaml_is_a_mapping_not_a_file_name(tmp_path):
    path = tmp_path / "name.pt"
    torch.save(corpus.our_checkpoint(yaml="/etc/hostname"), path)
    with pytest.raises(BadCheckpoint, match="its model YAML is a str, not a mapping"):
        attempt_load(path)


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_damaged_bytes_are_one_line_errors(tmp_path, fmt):
    """Bytes flipped in the archive structure, the pickle and the storages, and truncations: each file loads or is
    refused with a user error, never another exception."""
    src = tmp_path / "src.pt"
    ckpt = {"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=3)), "ema": None}
    torch.save(ckpt, src, _use_new_zipfile_serialization=fmt == "zip")
    data = src.read_bytes()
    rng = np.random.default_rng(0)
    spots = [*rng.integers(0, 4096, 12), *rng.integers(len(data) - 4096, len(data), 12), *rng.integers(0, len(data), 6)]
    for i, spot in enumerate(spots):
        damaged = bytearray(data)
        damaged[spot] ^= int(rng.integers(1, 256))
        path = tmp_path / f"d{i}.pt"
        path.write_bytes(bytes(damaged) if i % 5 else bytes(damaged[:spot]))
        try:
            attempt_load(path, fuse=False)
        except UserError:
            pass
