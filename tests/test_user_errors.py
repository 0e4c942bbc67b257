"""A user's mistake ends the real script with exit status 2, one `error:` line naming the file or option, and no
traceback; under a 2-rank torchrun every rank does so within 60 s. The mistakes the issue lists run the scripts as
subprocesses (concurrently); more run the same scripts' main in this process."""

import importlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import yaml

from models.checkpoints import model_to_ckpt
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from tests.ddp_utils import free_port
from utils.files import ROOT
from utils.run import run_cli

NAMES = ["circle", "rectangle", "triangle"]


def _yaml(file, **d):
    file.write_text(yaml.safe_dump(d))
    return file


@pytest.fixture(scope="module")
def world(tmp_path_factory, shapes_detect, shapes_classify):
    """Broken inputs next to a good dataset: {name: path}."""
    t = tmp_path_factory.mktemp("user_errors")
    root = yaml.safe_load(shapes_detect.read_text())["path"]
    (t / "images" / "empty").mkdir(parents=True)
    bad_cfg = yaml.safe_load((ROOT / "models" / "yolov5n.yaml").read_text())
    bad_cfg["backbone"][2][2] = "Bogus"
    m80 = DetectionModel("yolov5n.yaml", nc=80)
    m80.names = {i: str(i) for i in range(80)}
    torch.save({"model": model_to_ckpt(m80)}, t / "coco80.pt")
    torch.save({"epoch": 0, "model": model_to_ckpt(m80)}, t / "full.pt")
    (t / "last.pt").write_bytes((t / "full.pt").read_bytes()[:3000])
    torch.save({"epoch": 0, "model": model_to_ckpt(m80), "opt": {"cfg": "yolov5n.yaml"}, "optimizer": {}},
               t / "unfinished.pt")
    for name, model in {"cls": ClassificationModel("yolov8n-cls.yaml", nc=3),
                        "seg": SegmentationModel("yolov8n-seg.yaml", nc=3)}.items():
        model.names = dict(enumerate(NAMES))
        torch.save({"model": model_to_ckpt(model)}, t / f"{name}.pt")
    (t / "run" / "exp").mkdir(parents=True)
    (t / "run" / "exp" / "results.csv").write_text("epoch,loss\n0,1.0\n")
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.scratch-low.yaml").read_text())
    return {
        "good": shapes_detect,
        "no_val": _yaml(t / "no_val.yaml", path=root, train="images/train", names=NAMES),
        "nc": _yaml(t / "nc.yaml", path=root, train="images/train", val="images/val", nc=5, names=NAMES),
        "no_train": _yaml(t / "no_train.yaml", path=root, train="images/nowhere", val="images/val", names=NAMES),
        "empty": _yaml(t / "empty.yaml", path=str(t), train="images/empty", val="images/empty", names=NAMES),
        "bad_cfg": _yaml(t / "bad_cfg.yaml", **bad_cfg),
        "coco80": t / "coco80.pt",
        "unfinished": t / "unfinished.pt",
        "cls_data": shapes_classify,
        "cls": t / "cls.pt",
        "seg": t / "seg.pt",
        "last": t / "last.pt",
        "hyp": _yaml(t / "hyp_iou_t.yaml", **hyp, iou_t=0.2),
        "run": t / "run",
        "t": t,
    }


def _train(w, *extra):
    return ["train.py", "--data", str(w["good"]), "--img", "64", "--epochs", "1", "--batch-size", "2",
            "--workers", "0", "--device", "cpu", "--project", str(w["t"] / "runs"), *extra]


# name -> (argv built from the world, words the error line must contain)
CASES = {
    "data YAML without val": (lambda w: _train(w, "--data", str(w["no_val"])), ["no_val.yaml", "'val'"]),
    "nc differs from names": (lambda w: _train(w, "--data", str(w["nc"])), ["nc.yaml", "nc=5 but 3 names"]),
    "missing train path": (lambda w: _train(w, "--data", str(w["no_train"])), ["no_train.yaml", "images/nowhere"]),
    "missing --weights file": (lambda w: _train(w, "--weights", str(w["t"] / "nowhere.pt")), ["nowhere.pt"]),
    "--cfg typo": (lambda w: _train(w, "--cfg", "yolov8mm.yaml"), ["yolov8mm.yaml", "did you mean yolov8m.yaml?"]),
    "unknown module in model YAML": (lambda w: _train(w, "--cfg", str(w["bad_cfg"])),
                                     ["bad_cfg.yaml:", "backbone[2]", "unknown module 'Bogus'"]),
    "empty images folder": (lambda w: _train(w, "--data", str(w["empty"])), ["images/empty", "no supported files"]),
    "truncated last.pt to --resume": (lambda w: _train(w, "--resume", str(w["last"])),
                                      ["last.pt", "not a readable checkpoint"]),
    "bare --resume without runs": (lambda w: _train(w, "--resume", "--project", str(w["t"] / "noruns")),
                                   ["--resume", "no last.pt", "noruns"]),
    "80-class weights on a 3-class dataset": (
        lambda w: ["val.py", "--weights", str(w["coco80"]), "--data", str(w["good"]), "--img", "64", "--device",
                   "cpu", "--project", str(w["t"] / "val")], ["coco80.pt", "80 classes", "has 3"]),
}


# more mistakes, through the scripts' own main and parse_opt in this process (no interpreter start-up to pay)
IN_PROCESS = {
    "hyp key nothing reads": (lambda w: _train(w, "--hyp", str(w["hyp"])), ["hyp_iou_t.yaml", "'iou_t'"]),
    "--exist-ok into another run": (lambda w: _train(w, "--project", str(w["run"]), "--exist-ok"),
                                    ["--exist-ok", "holds another run", "results.csv"]),
    "--device without that GPU": (lambda w: _train(w, "--device", "9"), ["--device 9"]),
    "detect.py missing weights": (lambda w: ["detect.py", "--weights", str(w["t"] / "gone.pt"), "--source",
                                             str(ROOT / "data" / "images"), "--device", "cpu"], ["gone.pt"]),
    "segment/train.py data YAML without val": (
        lambda w: ["segment/train.py", *_train(w, "--data", str(w["no_val"]))[1:]], ["no_val.yaml", "'val'"]),
    "train.py given a segmentation --cfg": (
        lambda w: _train(w, "--cfg", "yolov8n-seg.yaml"),
        ["--cfg yolov8n-seg.yaml: a segment model", "takes detect models", "segment/train.py"]),
    "segment/train.py given detection --weights, no --cfg": (
        lambda w: ["segment/train.py", *_train(w, "--weights", str(w["coco80"]))[1:]],
        ["coco80.pt: a detect model", "takes segment models", "use train.py"]),
    "train.py given a classifier --cfg": (lambda w: _train(w, "--cfg", "yolov8n-cls.yaml"),
                                          ["--cfg yolov8n-cls.yaml: a classify model", "classify/train.py"]),
    "train.py given classifier --weights": (lambda w: _train(w, "--weights", str(w["cls"])),
                                            ["cls.pt: a classify model", "classify/train.py"]),
    "classify/train.py given a detection YAML": (
        lambda w: ["classify/train.py", "--data", str(w["cls_data"]), "--model", "yolov5n.yaml", "--device", "cpu",
                   "--project", str(w["t"] / "runs")], ["--model yolov5n.yaml: a detect model", "use train.py"]),
    "classify/train.py resuming a detection run": (
        lambda w: ["classify/train.py", "--resume", str(w["unfinished"]), "--device", "cpu"],
        ["--resume", "unfinished.pt: a detect model", "takes classify models", "use train.py"]),
    "detect.py given a classifier": (
        lambda w: ["detect.py", "--weights", str(w["cls"]), "--source", str(ROOT / "data" / "images"), "--device",
                   "cpu"], ["cls.pt: a classify model", "takes detect, segment or pose models", "classify/predict.py"]),
    "classify/predict.py given a detector": (
        lambda w: ["classify/predict.py", "--weights", str(w["coco80"]), "--source", str(ROOT / "data" / "images"),
                   "--device", "cpu"], ["coco80.pt: a detect model", "takes classify models", "use detect.py"]),
    "pose/predict.py given a segmenter": (
        lambda w: ["pose/predict.py", "--weights", str(w["seg"]), "--source", str(ROOT / "data" / "images"),
                   "--device", "cpu"], ["seg.pt: a segment model", "takes pose models", "segment/predict.py"]),
    "val.py given a classifier": (
        lambda w: ["val.py", "--weights", str(w["cls"]), "--data", str(w["good"]), "--device", "cpu"],
        ["cls.pt: a classify model", "classify/val.py"]),
    "segment/val.py given a detector": (
        lambda w: ["segment/val.py", "--weights", str(w["coco80"]), "--data", str(w["good"]), "--device", "cpu"],
        ["coco80.pt: a detect model", "takes segment models", "use val.py"]),
    "classify/train.py missing data folder": (
        lambda w: ["classify/train.py", "--data", str(w["t"] / "no-such-cls"), "--device", "cpu", "--epochs", "1"],
        ["no-such-cls"]),
}


def _run(argv, cwd, timeout=180):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


@pytest.fixture(scope="module")
def results(world):
    """Every case's completed process; run concurrently (they are mostly interpreter start-up)."""
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(_run, [str(ROOT / a) if i == 0 else a for i, a in enumerate(build(world))],
                                     world["t"]) for name, (build, _) in CASES.items()}
        return {name: f.result()[0] for name, f in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_user_error_is_one_line_and_exit_2(results, name):
    p = results[name]
    out = p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert len(errors) == 1 and all(word in errors[0] for word in CASES[name][1]), errors


@pytest.mark.parametrize("name", list(IN_PROCESS))
def test_more_user_errors(world, name, capsys):
    argv = IN_PROCESS[name][0](world)
    script = importlib.import_module(argv[0].removesuffix(".py").replace("/", "."))
    with pytest.raises(SystemExit) as e:
        run_cli(script.main, lambda: script.parse_opt(argv[1:]))
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert e.value.code == 2 and len(errors) == 1 and all(w in errors[0] for w in IN_PROCESS[name][1]), errors


def test_a_bug_keeps_its_traceback(tmp_path):
    script = tmp_path / "bug.py"
    script.write_text("from utils.run import run_cli\n\n\ndef main(opt):\n    return {}[opt]\n\n\n"
                      "run_cli(main, lambda: 'key')\n")
    p, _ = _run([str(script)], tmp_path, timeout=60)
    assert p.returncode == 1 and "Traceback" in p.stderr and "KeyError" in p.stderr and "error: " not in p.stderr


@pytest.mark.parametrize("raise_it, what", [
    ("raise MemoryError('Unable to allocate 27.9 GiB for an array with shape (100000, 100000, 3)')",
     "Unable to allocate 27.9 GiB for an array with shape (100000, 100000, 3)"),
    ("import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB.\\nGPU 0 has...')",
     "CUDA out of memory. Tried to allocate 20.00 GiB."),
    ("raise MemoryError()", "no details"),
    ("import torch; torch.empty(10**13)", "DefaultCPUAllocator: can't allocate memory: you tried to allocate"),
])
def test_running_out_of_memory_is_one_line(tmp_path, raise_it, what):
    script = tmp_path / "oom.py"
    script.write_text(f"from utils.run import run_cli\n\n\ndef main(opt):\n    {raise_it}\n\n\n"
                      "run_cli(main, lambda: None)\n")
    p, _ = _run([str(script)], tmp_path, timeout=60)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(errors) == 1 and errors[0].startswith("error: out of memory (") and what in errors[0], p.stderr
    assert errors[0].endswith("): the command needs more memory than this machine has; a smaller --batch-size or "
                              "--img needs less"), p.stderr


def test_script_download_is_refused_not_run(tmp_path):
    """A dataset YAML's `download:` script (the official repositories run it) ends train.py before it runs."""
    marker = tmp_path / "marker"
    data = tmp_path / "script_download.yaml"
    data.write_text(f"path: {tmp_path / 'datasets' / 'ds'}\ntrain: images/train\nval: images/val\nnames: [a]\n"
                    f"download: |\n  import pathlib\n  pathlib.Path(r'{marker}').write_text('ran')\n")
    p, _ = _run([str(ROOT / "train.py"), "--data", str(data), "--img", "64", "--epochs", "1", "--device", "cpu",
                 "--workers", "0", "--project", str(tmp_path / "runs")], tmp_path, timeout=120)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert not marker.exists(), "the YAML's script ran"
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    assert errors == [f"error: {data}: 'download' is a script; scripts in dataset YAMLs are not run (nothing this "
                      "project reads may run code): download the data yourself, or give archive URLs"], errors


TORCHRUN = ["data YAML without val", "missing --weights file", "--batch-size below WORLD_SIZE"]


def _torchrun(name, w):
    argv = _train(w, "--batch-size", "1") if name == "--batch-size below WORLD_SIZE" else CASES[name][0](w)
    logs = w["t"] / "torchrun" / name.replace(" ", "_")
    cmd = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "--redirects", "3", "--log-dir", str(logs), str(ROOT / argv[0]), *argv[1:]]
    p, seconds = _run(cmd, w["t"], timeout=120)
    rank_err = {r: sorted(logs.rglob(f"attempt_0/{r}/stderr.log"))[0].read_text() for r in (0, 1)}
    return p, seconds, rank_err


@pytest.mark.ddp
def test_every_rank_reports_and_exits_under_torchrun(world):
    words = {**{n: CASES[n][1] for n in TORCHRUN[:2]}, TORCHRUN[2]: ["--batch-size 1", "WORLD_SIZE 2"]}
    for name in TORCHRUN:  # one at a time: each is timed
        p, seconds, rank_err = _torchrun(name, world)
        assert p.returncode != 0 and seconds < 60, (name, seconds)
        assert p.stderr.count("exitcode  : 2") == 2, (name, p.stderr[-2000:])  # the launcher's summary of both ranks
        for rank, err in rank_err.items():
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            assert "Traceback" not in err and len(errors) == 1, (name, rank, err[-2000:])
            assert all(word in errors[0] for word in words[name]), (name, rank, errors)
        print(f"torchrun, {name}: {seconds:.1f} s")
