r"""Controlled training studies: the same job under several variants (one change each) and several seeds, whole
processes, final metrics and wall time in one table. Accuracy figures do not depend on how busy the machine is;
the times do (compare them only between runs made back to back).

    python ../shared/peers/make_shapes.py --out /tmp/shapes --seed 0
    # bf16 against fp32 (issue: make bf16 the CPU default only where its mean mAP50-95 is within 0.01)
    python -m benchmarks.study --data /tmp/shapes/shapes-det.yaml --cfgs yolov8n.yaml yolov5n.yaml \
        --seeds 0 1 2 --variant fp32 --amp off --variant bf16 --amp bf16
    # a recipe study: one change against the defaults
    python -m benchmarks.study --cfgs yolov8n.yaml --seeds 0 --variant default --variant iou07 --hyp my.yaml

    # a long schedule against the peers' defaults (their venv: bash ../shared/peers/setup.sh)
    python ../shared/peers/make_shapes.py --out /tmp/shapes6 --seed 1 --nc 6
    python -m benchmarks.study --data /tmp/shapes6/shapes-det.yaml --cfgs yolov8n.yaml --epochs 100 --seeds 0 \
        --peers ultralytics --peer-threads 2
    # fine-tuning both tools from the same weights (ours converted for Ultralytics by to_ultralytics.py)
    python -m benchmarks.study --data /tmp/shapes/shapes-det.yaml --seeds 0 --peers ultralytics \
        --peer-weights start-ul.pt --variant default --weights best.pt
    # segmentation (box and mask mAP): segment/train.py against `yolo segment train`
    python -m benchmarks.study --task segment --data /tmp/shapes/shapes-seg.yaml --cfgs yolov8n-seg.yaml \
        --seeds 0 --peers ultralytics --variant default --variant gain1 --hyp gain1.yaml

Each `--variant NAME` is followed by the options it adds to every train.py command. `--peers` adds a row per peer,
trained with that tool's own defaults on the same data, size, batch, epochs and seed: `ultralytics` (its `yolo
detect train`, any cfg it knows) and `yolov5` (the yolov5 package's SGD recipe, v5 cfgs only). Runs go in the order
seed, cfg, variant (so an interrupted study still holds complete pairs), each in <out>/<cfg>-<variant>-s<seed>;
a run whose results.csv already has every epoch is read, not repeated. The table (medians and means over seeds)
is printed and written to <out>/study.md; each run's figures to <out>/study.json.
"""

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer_commands import ultralytics_train
from utils.files import ROOT

# each task: our script, and the suffixes of its metric columns (box, then mask), read the same from Ultralytics
TASKS = {"detect": ("train.py", ("B",)), "segment": ("segment/train.py", ("B", "M"))}
# the box figures under the yolov5 package's column names
YOLOV5_COLUMNS = {"mAP50(B)": "metrics/mAP_0.5", "mAP50-95(B)": "metrics/mAP_0.5:0.95"}
PEERS = ("ultralytics", "yolov5")

def peer_command(opt, peer, cfg, seed, out, name):
    """The peer's own training command, its defaults apart from the data, size, batch, epochs and seed."""
    bin_dir = Path(opt.peers_venv) / "bin"
    if peer == "ultralytics":
        start = {"model": opt.peer_weights} if opt.peer_weights else {"model": cfg, "pretrained": False}
        args = {"data": opt.data, **start, "epochs": opt.epochs, "imgsz": opt.img, "batch": opt.batch, "device": "cpu",
                "seed": seed, "plots": False, "project": out, "name": name, "exist_ok": True}
        if opt.peer_threads:
            return ultralytics_train(bin_dir / "python", opt.peer_threads, args)
        return [str(bin_dir / "yolo"), opt.task, "train", *(f"{k}={v}" for k, v in args.items())]
    return [str(bin_dir / "yolov5"), "train", "--data", opt.data, "--cfg", cfg, "--weights", "", "--img",
            str(opt.img), "--batch-size", str(opt.batch), "--epochs", str(opt.epochs), "--device", "cpu", "--seed",
            str(seed), "--noplots", "--project", str(out), "--name", name, "--exist-ok"]


def peer_env(opt):
    """The variables the peers' venv sets (offline, no trackers, their own config folder)."""
    env = dict(os.environ)
    script = Path(opt.peers_venv) / "peer-env.sh"
    for line in script.read_text().splitlines() if script.exists() else []:
        if line.startswith("export "):
            env.update(item.split("=", 1) for item in shlex.split(line[len("export "):]))
    return env


def parse_variants(argv):
    """['--variant', 'a', '--amp', 'off', '--variant', 'b'] -> (rest, {'a': ['--amp', 'off'], 'b': []})."""
    rest, variants, current = [], {}, None
    it = iter(argv)
    for arg in it:
        if arg == "--variant":
            current = next(it, None)
            if not current or current.startswith("-"):
                raise SystemExit("error: --variant needs a name")
            variants[current] = []
        elif current is not None:
            variants[current].append(arg)
        else:
            rest.append(arg)
    return rest, variants or {"default": []}


def best_row(results_csv, epochs, suffixes, columns=None):
    """The row best.pt was saved from as (epoch from 1, {'mAP50(B)': ..., 'mAP50-95(B)': ..., ...}), or None while
    the run is unfinished. Best is the highest sum over `suffixes` of 0.1 mAP50 + 0.9 mAP50-95, as both tools pick
    it; `columns` maps a figure to a peer's own column name."""
    if not results_csv.exists():
        return None
    names = [f"{m}({s})" for s in suffixes for m in ("mAP50", "mAP50-95")]
    columns = {n: (columns or {}).get(n, f"metrics/{n}") for n in names}
    with open(results_csv) as f:
        rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(f)]
    rows = [(i + 1, {n: float(r[c]) for n, c in columns.items()}) for i, r in enumerate(rows)
            if all(r.get(c) for c in columns.values())]
    if len(rows) < epochs:
        return None
    return max(rows, key=lambda r: sum(0.1 * r[1][f"mAP50({s})"] + 0.9 * r[1][f"mAP50-95({s})"] for s in suffixes))


def run_one(opt, cfg, variant, args, seed, out):
    """One training run (ours with the variant's options, or a peer's own command), or its finished results."""
    name = f"{Path(cfg).stem}-{variant}-s{seed}"
    script, suffixes = TASKS[opt.task]
    columns = YOLOV5_COLUMNS if variant == "yolov5" else None  # no variant of ours has a peer's name (main refuses it)
    results = out / name / "results.csv"
    row, seconds, cmd = best_row(results, opt.epochs, suffixes, columns), None, None
    if row is None:
        if variant in PEERS:
            cmd, env = peer_command(opt, variant, cfg, seed, out, name), peer_env(opt)
        else:
            cmd = [sys.executable, str(ROOT / script), "--data", opt.data, "--cfg", cfg, "--img", str(opt.img),
                   "--epochs", str(opt.epochs), "--batch-size", str(opt.batch), "--device", "cpu", "--seed",
                   str(seed), "--project", str(out), "--name", name, "--exist-ok", "--noplots", *args]
            env = None
        t0 = time.perf_counter()
        with open(out / f"{name}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        seconds = time.perf_counter() - t0
        if rc:
            raise SystemExit(f"error: {name} exited {rc}; see {out / f'{name}.log'}")
        row = best_row(results, opt.epochs, suffixes, columns)
    epoch, figures = row
    return {"cfg": cfg, "variant": variant, "seed": seed, "seconds": seconds, "epoch": epoch, **figures,
            "command": cmd}


def table(records, variants, suffixes):
    """Means over seeds of each figure, the box mAP50-95 of every seed, and the median minutes per run."""
    figures = [f"{m}({s})" for s in suffixes for m in ("mAP50", "mAP50-95")]
    lines = ["| model | variant | seeds | " + " | ".join(f"{f} mean" for f in figures) +
             " | mAP50-95(B) per seed | min/run median |", "|---|---|---|" + "---|" * len(figures) + "---|---|"]
    for cfg in dict.fromkeys(r["cfg"] for r in records):
        for v in variants:
            rs = [r for r in records if r["cfg"] == cfg and r["variant"] == v]
            if not rs:
                continue
            times = [r["seconds"] for r in rs if r["seconds"]]
            minutes = f"{statistics.median(times) / 60:.1f}" if times else "-"
            means = " | ".join(f"{statistics.mean(r[f] for r in rs):.3f}" for f in figures)
            per_seed = " ".join(f"{r['mAP50-95(B)']:.3f}" for r in rs)
            lines.append(f"| {Path(cfg).stem} | {v} | {len(rs)} | {means} | {per_seed} | {minutes} |")
    return "\n".join(lines)


def main():
    argv, variants = parse_variants(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="detect", choices=TASKS, help="segment: our segment/train.py, `yolo segment "
                   "train`, box and mask figures")
    p.add_argument("--data", default="/tmp/shapes/shapes-det.yaml")
    p.add_argument("--cfgs", nargs="+", default=["yolov8n.yaml"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--out", default="runs/study")
    p.add_argument("--peers", nargs="*", default=[], choices=PEERS, help="a row per peer, with its own defaults")
    p.add_argument("--peers-venv", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "peers-venv"))
    p.add_argument("--peer-threads", type=int, default=0,
                   help="Ultralytics trains with torch at this many threads (default: its own choice)")
    p.add_argument("--peer-weights", help="Ultralytics fine-tunes from this .pt (benchmarks/to_ultralytics.py) "
                   "instead of training from scratch; give our variants the same start with --weights")
    opt = p.parse_args(argv)
    clash = set(variants) & set(PEERS)
    if clash:
        raise SystemExit(f"error: --variant {clash.pop()} is the name of a peer's row")
    if opt.task != "detect" and "yolov5" in opt.peers:
        raise SystemExit("error: the yolov5 peer row trains detection only")
    variants.update({peer: [] for peer in opt.peers})
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in opt.seeds:
        for cfg in opt.cfgs:
            for variant, args in variants.items():
                if variant == "yolov5" and not Path(cfg).stem.startswith("yolov5"):
                    continue  # the yolov5 package trains its own family only
                records.append(run_one(opt, cfg, variant, args, seed, out))
                r = records[-1]
                figures = " ".join(f"{k} {r[k]:.3f}" for k in r if k.startswith("mAP"))
                print(f"{Path(cfg).stem:<10} {variant:<10} seed {seed}: {figures} (epoch {r['epoch']}), "
                      f"{r['seconds'] or 0:.0f} s", flush=True)
                (out / "study.json").write_text(json.dumps(records, indent=1))
                (out / "study.md").write_text(table(records, variants, TASKS[opt.task][1]) + "\n")
    print(table(records, variants, TASKS[opt.task][1]))


if __name__ == "__main__":
    main()
