"""The Python steps of benchmarks/gpu_check.sh: versions, its datasets, the device's colour against OpenCV's, and
host-device synchronisations per training step of either tool. Figures and checks for one lent GPU; each also runs
on a CPU (DEVICE=cpu), which is how the tests keep the script working.

    python -m benchmarks.device_checks versions
    python -m benchmarks.device_checks data --out /tmp/gc/data --n-train 256 --n-val 64 --max-side 640
    python -m benchmarks.device_checks hsv --device 0
    python -m benchmarks.device_checks syncs --tool ours --data /tmp/gc/data/tiny.yaml --device 0
"""

import argparse
import collections
import os
import runpy
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml
from torch.optim.optimizer import register_optimizer_step_post_hook

from utils.files import ROOT


def versions(opt):
    """Everything a figure depends on, one line each."""
    import cv2

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}, "
          f"opencv {cv2.__version__}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"cuda {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}, {p.name}, "
              f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, {torch.cuda.device_count()} GPU(s)")
    else:
        print("no CUDA device")
    try:
        import onnxruntime
        print(f"onnxruntime {onnxruntime.__version__}, providers {onnxruntime.get_available_providers()}")
    except ImportError:
        print("no onnxruntime")
    print(f"{os.cpu_count()} CPU cores")


SETS = {"det": "shapes.yaml", "seg": "shapes-seg.yaml", "pose": "shapes-pose.yaml"}


def data(opt):
    """det.yaml, seg.yaml and pose.yaml under --out (the project's shapes sets, sized here and generated now), and
    tiny.yaml: 6 batches of 8 for the sync counts."""
    from data.synthetic import generate_dataset

    out = Path(opt.out).resolve()
    sizes = {"det": opt.n_train, "seg": opt.n_train, "pose": opt.n_train, "tiny": 48}
    for name, n_train in sizes.items():
        d = yaml.safe_load((ROOT / "data" / SETS.get(name, "shapes.yaml")).read_text())
        spec = {**d.pop("synthetic"), "n_train": n_train, "n_val": 8 if name == "tiny" else opt.n_val,
                "min_side": 64 if name == "tiny" else opt.min_side, "max_side": 96 if name == "tiny" else opt.max_side}
        root = out / name
        if not (root / "images" / "val").is_dir():
            generate_dataset(root, workers=os.cpu_count() or 1, **spec)
        (out / f"{name}.yaml").write_text(yaml.safe_dump({**d, "path": str(root)}, sort_keys=False))
        print(f"{out / f'{name}.yaml'}: {spec['task']}, {n_train} train / {spec['n_val']} val images")


def hsv(opt):
    """A training batch's colour applied on the device (`augment.apply_hsv_batch`, what a GPU run does) against the
    worker's OpenCV (`augment.apply_hsv`, what a CPU run does): at most one grey level apart."""
    from data import augment as A
    from utils.dist import select_device

    device = select_device(opt.device)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (8, 3, 160, 224), dtype=np.uint8)
    gains = [A.hsv_gains(0.015, 0.7, 0.4, rng) for _ in img]
    tables = torch.from_numpy(np.stack([A.hsv_tables(r) for r in gains]))
    on_device = A.apply_hsv_batch(torch.from_numpy(img).float().to(device) / 255, tables.to(device)).cpu() * 255
    cv = np.stack([A.apply_hsv(np.ascontiguousarray(im.transpose(1, 2, 0)[..., ::-1]), r)[..., ::-1].transpose(2, 0, 1)
                   for im, r in zip(img, gains)])
    diff = (on_device - torch.from_numpy(cv.astype(np.float32))).abs()
    print(f"{device}: colour against OpenCV's, max {diff.max().item():.3f} grey levels, "
          f"{(diff > 0.5).float().mean().item():.2e} of values differ")
    if diff.max().item() > 1 + 1e-3:
        raise SystemExit("error: the device's colour is more than one grey level from OpenCV's")


TASK_SCRIPTS = {"-seg": "segment/train.py", "-pose": "pose/train.py"}  # else train.py


class _Enough(BaseException):  # ends a run after its steps; a callback's Exception would be caught and logged
    pass


def syncs(opt):
    """Host-device synchronisations per optimizer step of one tool: --steps steps of the first epoch on a tiny set, each
    batch a step, then the run is ended. Counted by benchmarks/sync_counter.py (its `waits`, the rule of
    ../shared/peers/sync_count.py, and with the host copies that counter cannot see on a CPU): the median over the
    intervals between steps, with the lines of a median one; on CUDA also as CUDA reports them
    (`torch.cuda.set_sync_debug_mode("warn")`: a warning per synchronisation)."""
    from benchmarks.sync_counter import SyncCounter, waits

    cuda = collections.Counter()
    seen_at_step = []

    def seen(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            cuda[f"{os.path.relpath(filename) if filename.startswith(os.getcwd()) else filename}:{lineno}"] += 1

    def stop_after_steps(*args):
        if len(counter.steps) >= opt.steps:
            raise _Enough

    on_cuda = torch.cuda.is_available() and opt.device != "cpu"
    warnings.showwarning = seen
    warnings.simplefilter("always")
    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: seen_at_step.append(cuda.copy()))
    if on_cuda:
        torch.cuda.set_sync_debug_mode("warn")
    counter = SyncCounter()
    try:
        with counter:
            _train_tiny(opt, stop_after_steps)
    except _Enough:
        pass
    finally:
        if on_cuda:
            torch.cuda.set_sync_debug_mode("default")
        handle.remove()
    steps = counter.intervals()
    if len(steps) < 2:
        raise SystemExit(f"error: {opt.tool}: {len(counter.steps)} optimizer steps seen (fewer than 3)")
    rule = statistics.median(waits(ops) for ops, _ in steps)
    whole = statistics.median(sum(ops.values()) for ops, _ in steps)
    _, where = min(steps, key=lambda s: (abs(waits(s[0]) - rule), abs(sum(s[0].values()) - whole)))
    print(f"{opt.tool} {opt.cfg} on {opt.device}: {len(steps)} steps; syncs/step (sync_count.py's rule): {rule:g}, "
          f"with host copies: {whole:g}; a median step: {', '.join(f'{w} x{n}' for w, n in sorted(where.items()))}")
    cuda_steps = [sum((b - a).values()) for a, b in zip(seen_at_step, seen_at_step[1:])]
    if on_cuda and cuda_steps:
        top = ", ".join(f"{w} x{n}" for w, n in cuda.most_common(8))
        print(f"{opt.tool}: CUDA synchronisations/step (set_sync_debug_mode): {statistics.median(cuda_steps):g}; "
              f"where (whole run): {top}")


def _train_tiny(opt, on_batch_end):
    """One epoch of `opt.cfg` on `opt.data` with either tool, without AMP (as Ultralytics on a CPU), validation or
    plots, each batch an optimizer step (nbs = batch); `on_batch_end` is called after every batch."""
    if opt.tool == "ours":
        hyp = Path(opt.project) / "nbs.yaml"
        hyp.parent.mkdir(parents=True, exist_ok=True)
        hyp.write_text(f"nbs: {opt.batch}\n")
        script = runpy.run_path(str(ROOT / next((v for k, v in TASK_SCRIPTS.items() if k in opt.cfg), "train.py")))
        args = ["--data", opt.data, "--cfg", opt.cfg, "--img", str(opt.img), "--epochs", "1", "--batch-size",
                str(opt.batch), "--device", opt.device, "--workers", "0", "--amp", "off", "--hyp", str(hyp),
                "--noplots", "--noval", "--project", opt.project, "--name", "syncs", "--exist-ok"]
        script["main"](script["parse_opt"](args), callbacks={"on_train_batch_end": [on_batch_end]})
    else:
        from ultralytics import YOLO

        model = YOLO(opt.cfg)
        model.add_callback("on_train_batch_end", on_batch_end)
        model.train(data=opt.data, epochs=1, imgsz=opt.img, batch=opt.batch, workers=0, device=opt.device, amp=False,
                    val=False, plots=False, nbs=opt.batch, project=opt.project, name="syncs-ultralytics", exist_ok=True,
                    verbose=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("versions")
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--n-train", type=int, default=256)
    d.add_argument("--n-val", type=int, default=64)
    d.add_argument("--min-side", type=int, default=256)
    d.add_argument("--max-side", type=int, default=640)
    h = sub.add_parser("hsv")
    h.add_argument("--device", default="0")
    s = sub.add_parser("syncs")
    s.add_argument("--tool", choices=["ours", "ultralytics"], default="ours")
    s.add_argument("--data", required=True)
    s.add_argument("--cfg", default="yolov8n.yaml")
    s.add_argument("--img", type=int, default=64)
    s.add_argument("--batch", type=int, default=8)
    s.add_argument("--device", default="0")
    s.add_argument("--steps", type=int, default=6, help="optimizer steps, then the run is ended (tiny.yaml: 6 batches)")
    s.add_argument("--project", default="runs/device_checks")
    opt = p.parse_args()
    {"versions": versions, "data": data, "hsv": hsv, "syncs": syncs}[opt.what](opt)


if __name__ == "__main__":
    main()
