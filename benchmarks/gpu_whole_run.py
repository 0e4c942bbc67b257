"""Whole training runs on one GPU, ours and Ultralytics' side by side: each a command started from scratch and timed
to its exit, alternating (ours, peer, ours, peer ...), with the GPU's memory and utilisation sampled by nvidia-smi
during the run and the last epoch's mAP read from each run's results.csv (both write the same column names).

    python -m benchmarks.gpu_whole_run --models yolov8n.yaml yolov8s.yaml          # on the GPU machine
    DEVICE=cpu python -m benchmarks.gpu_whole_run --device cpu --n-train 32 --n-val 8 --img 128 --batch 8 --epochs 1

The data is the project's synthetic generator (`--n-train` / `--n-val` images of `--min-side`-`--img` px); both
tools read the same folder through one plain dataset YAML. Each tool runs at its defaults otherwise (workers,
close_mosaic, charts). Without Ultralytics importable by `--peer-python`, only our commands run.
"""

import argparse
import csv
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from data.synthetic import CLASS_NAMES, generate_dataset
from utils.files import ROOT

PEER = ("import sys; from ultralytics import YOLO; YOLO(sys.argv[1]).train(data=sys.argv[2], pretrained=False, "
        "epochs=int(sys.argv[3]), imgsz=int(sys.argv[4]), batch=int(sys.argv[5]), device=sys.argv[6], "
        "project=sys.argv[7], name=sys.argv[8], exist_ok=True)")


class GpuSampler:
    """Polls nvidia-smi every 200 ms in a thread: peak memory.used (MiB) and mean utilisation (%) over a run."""

    def __init__(self):
        self.mem, self.util, self.proc = [], [], None

    def __enter__(self):
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu",
                                          "--format=csv,noheader,nounits", "-lms", "200"],
                                         stdout=subprocess.PIPE, text=True)
        except FileNotFoundError:
            return self
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                mem, util = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.mem.append(mem)
            self.util.append(util)

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def summary(self, idle_mem):
        if not self.mem:
            return float("nan"), float("nan")
        return max(self.mem) - idle_mem, statistics.mean(self.util)


def idle_memory():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return float(out.split()[0])
    except (FileNotFoundError, subprocess.CalledProcessError, ValueError, IndexError):
        return 0.0


def make_data(out, n_train, n_val, min_side, max_side, workers):
    root = out / "data"
    if not (root / "images" / "val").is_dir():
        generate_dataset(root, "detect", n_train, n_val, seed=1, min_side=min_side, max_side=max_side,
                         workers=workers)
    yaml = out / "data.yaml"
    names = "".join(f"  {i}: {n}\n" for i, n in enumerate(CLASS_NAMES))
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    return yaml


def last_map(results_csv):
    """(mAP50, mAP50-95) of the last epoch in a results.csv (column names padded with spaces by Ultralytics)."""
    try:
        with open(results_csv) as f:
            rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
        return float(rows[-1]["metrics/mAP50(B)"]), float(rows[-1]["metrics/mAP50-95(B)"])
    except (OSError, KeyError, IndexError, ValueError):
        return float("nan"), float("nan")


def timed_run(cmd, log, env, limit):
    """(exit status, wall s, peak MiB, mean util %); a run past `limit` s is killed with its workers (status -9)."""
    idle = idle_memory()
    t0 = time.perf_counter()
    with GpuSampler() as gpu, open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    wall = time.perf_counter() - t0
    return rc, wall, *gpu.summary(idle)


def commands(opt, data, out, model, i):
    stem = Path(model).stem
    ours = [sys.executable, str(ROOT / "train.py"), "--data", str(data), "--cfg", model, "--img", str(opt.img),
            "--epochs", str(opt.epochs), "--batch-size", str(opt.batch), "--device", opt.device,
            "--project", str(out / "ours"), "--name", f"{stem}-{i}", *opt.ours_args]
    peer = [opt.peer_python, "-c", PEER, model, str(data), str(opt.epochs), str(opt.img), str(opt.batch),
            opt.device, str(out / "ultralytics"), f"{stem}-{i}"]
    return {"ours": (ours, out / "ours" / f"{stem}-{i}"), "ultralytics": (peer, out / "ultralytics" / f"{stem}-{i}")}


def have_peer(python):
    return subprocess.run([python, "-c", "import ultralytics"], capture_output=True).returncode == 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["yolov8n.yaml", "yolov8s.yaml"])
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-val", type=int, default=400)
    p.add_argument("--min-side", type=int, default=512)
    p.add_argument("--img", type=int, default=640, help="training size, also the largest image side generated")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="0")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="also one run of ours per model with --profile")
    p.add_argument("--run-timeout", type=float, default=240, help="kill a run after this many seconds")
    p.add_argument("--budget", type=float, default=0, help="start no run after this many seconds (0: no limit)")
    p.add_argument("--peer-python", default=sys.executable, help="a Python that imports ultralytics")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "runs"), "gpu_whole_run"))
    p.add_argument("--ours-args", nargs=argparse.REMAINDER, default=[], help="extra options for our commands")
    opt = p.parse_args()
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = make_data(out, opt.n_train, opt.n_val, opt.min_side, opt.img, os.cpu_count() or 1)
    print(f"data: {opt.n_train} train / {opt.n_val} val images in {time.perf_counter() - t0:.1f} s", flush=True)
    sides = ["ours", "ultralytics"] if have_peer(opt.peer_python) else ["ours"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    print(f"{'model':<14}{'tool':<13}{'rc':>4}{'wall s':>9}{'img/s':>8}{'peak MiB':>10}{'util %':>8}"
          f"{'mAP50':>8}{'mAP50-95':>10}", flush=True)
    def spent():
        return opt.budget and time.perf_counter() - t0 >= opt.budget

    for model in opt.models:
        for i in range(opt.repeats):
            for side, (cmd, run_dir) in commands(opt, data, out, model, i).items():
                if side not in sides or spent():
                    continue
                rc, wall, mem, util = timed_run(cmd, out / f"{Path(model).stem}-{side}.log", env, opt.run_timeout)
                m50, m5095 = last_map(run_dir / "results.csv")
                ips = opt.n_train * opt.epochs / wall
                print(f"{model:<14}{side:<13}{rc:>4}{wall:>9.1f}{ips:>8.0f}{mem:>10.0f}{util:>8.0f}"
                      f"{m50:>8.3f}{m5095:>10.3f}", flush=True)
        if opt.profile and not spent():
            cmd, run_dir = commands(opt, data, out, model, "profile")["ours"]
            rc, wall, mem, util = timed_run(cmd + ["--profile"], out / f"{Path(model).stem}-profile.log", env,
                                            opt.run_timeout)
            print(f"{model:<14}{'ours+profile':<13}{rc:>4}{wall:>9.1f}", flush=True)
            log = (out / f"{Path(model).stem}-profile.log").read_text().splitlines()
            start = next((k for k, line in enumerate(log) if line.startswith("Profile:")), len(log))
            print("\n".join(log[start:start + 14]), flush=True)


if __name__ == "__main__":
    main()
