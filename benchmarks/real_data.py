r"""Ours and Ultralytics side by side on a real dataset from a real starting checkpoint: each tool's own defaults at
equal epochs, image size, batch and seed, runs alternated (ours, then Ultralytics, per seed), one row per epoch per
run with the box mAPs and the wall time since the process started (read off results.csv as each epoch's row lands).

    # COCO128 (fetched by hand, never by a test: the lightly-ai/coco128_yolo repository) as a plain YOLO dataset
    python -m benchmarks.real_data --data /tmp/coco128/coco128.yaml --weights /tmp/realpkgs/best.pt \
        --epochs 20 --img 320 --batch 16 --seeds 0 --out runs/real_data/coco128
    # the same images in a Roboflow export's layout (data.yaml beside train/ valid/, `../train/images`)
    python -m benchmarks.real_data --data /tmp/coco128/roboflow/data.yaml --weights /tmp/realpkgs/best.pt ...
    # an ablation of ours: each --variant NAME is followed by the options it adds to our train.py
    python -m benchmarks.real_data --data ... --weights ... --variant default --variant no-amp --amp off
    # from scratch: a model YAML for both tools
    python -m benchmarks.real_data --data ... --cfg yolov8n.yaml --epochs 100

Without --cfg our train.py trains the checkpoint's own model, as `yolo train model=x.pt` does; Ultralytics gets
`--peer-weights` when given (an Ultralytics file made from ours by to_ultralytics.py), else the same --weights. The
peers' venv is /tmp/peers-venv (bash ../shared/peers/setup.sh); Ultralytics runs at --peer-threads torch threads
(2: its best on 2 cores; its own default is cpu_count - 1). A run whose results.csv already has every epoch is read
again, not repeated (its times come from rows.json). Out: <out>/rows.csv (tool, variant, seed, epoch, mAP50,
mAP50-95, seconds), <out>/real_data.md (per epoch, each run side by side), each run's log beside its folder.
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer_commands import ultralytics_train
from benchmarks.study import parse_variants, peer_env
from utils.files import ROOT

FIGURES = ("mAP50(B)", "mAP50-95(B)")  # the column names both tools write, after `metrics/`
POLL_S = 1.0


def read_epochs(results_csv):
    """[(mAP50, mAP50-95), ...] of the epochs results.csv holds so far (either tool's)."""
    if not results_csv.exists():
        return []
    with open(results_csv) as f:
        rows = [{k.strip(): v.strip() for k, v in r.items() if k} for r in csv.DictReader(f)]
    columns = [f"metrics/{n}" for n in FIGURES]
    return [tuple(float(r[c]) for c in columns) for r in rows if all(r.get(c) for c in columns)]


def commands(opt, seed, out):
    """{run name: (tool, variant, argv, env)} for one seed, in the order they run."""
    runs = {}
    start = ["--weights", opt.weights] if opt.weights else []
    for variant, args in opt.variants.items():
        name = f"ours-{variant}-s{seed}"
        argv = [sys.executable, str(ROOT / "train.py"), "--data", opt.data, *(["--cfg", opt.cfg] if opt.cfg else []),
                *start, "--img", str(opt.img), "--epochs", str(opt.epochs), "--batch-size", str(opt.batch),
                "--device", "cpu", "--seed", str(seed), "--project", str(out), "--name", name, "--exist-ok",
                "--noplots", *args]
        runs[name] = ("ours", variant, argv, None)
    if opt.peer:
        model = opt.peer_weights or opt.weights
        model_args = {"model": model} if model else {"model": opt.cfg, "pretrained": False}
        args = {"data": opt.peer_data or opt.data, **model_args, "epochs": opt.epochs, "imgsz": opt.img,
                "batch": opt.batch, "device": "cpu", "seed": seed, "plots": False, "project": out,
                "name": f"ultralytics-s{seed}", "exist_ok": True}
        python = Path(opt.peers_venv) / "bin" / "python"
        runs[f"ultralytics-s{seed}"] = ("ultralytics", "defaults", ultralytics_train(python, opt.peer_threads, args),
                                        peer_env(opt))
    return runs


def run_timed(argv, env, run_dir, log):
    """Run argv; the seconds since its start at which each epoch's row appeared in run_dir/results.csv."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run's folder: train.py would refuse to mix runs
    results, seen, times = run_dir / "results.csv", 0, []
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        while True:
            done = proc.poll() is not None
            n = len(read_epochs(results))
            times += [round(time.perf_counter() - t0, 1)] * (n - seen)
            seen = n
            if done:
                break
            time.sleep(POLL_S)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(map(str, argv[:3]))}... exited {proc.returncode}; see {log}")
    return times, round(time.perf_counter() - t0, 1)


def table(records, epochs):
    """Per epoch, each run's mAP50-95 / mAP50 and seconds."""
    head = "| epoch | " + " | ".join(f"{r['name']} mAP50-95 / mAP50 (s)" for r in records) + " |"
    lines = [head, "|---|" + "---|" * len(records)]
    for e in range(epochs):
        cells = [f"{r['epochs'][e][1]:.4f} / {r['epochs'][e][0]:.4f} ({r['seconds'][e]:.0f})"
                 if e < len(r["epochs"]) else "-" for r in records]
        lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
    lines.append("| whole process, s | " + " | ".join(f"{r['total_s']:.0f}" for r in records) + " |")
    return "\n".join(lines)


def main():
    argv, variants = parse_variants(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="dataset YAML, or a folder holding a dataset (ours finds the layout)")
    p.add_argument("--peer-data", help="Ultralytics' dataset YAML when it cannot read --data (default: --data)")
    p.add_argument("--weights", help="the starting checkpoint (an Ultralytics .pt, official or trained, or ours)")
    p.add_argument("--peer-weights", help="Ultralytics' starting .pt when --weights is ours (to_ultralytics.py)")
    p.add_argument("--cfg", help="a model YAML: ours trains it (seeded from --weights); from scratch without --weights")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--no-peer", dest="peer", action="store_false", help="ours only")
    p.add_argument("--peers-venv", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "peers-venv"))
    p.add_argument("--peer-threads", type=int, default=2, help="Ultralytics' torch threads")
    p.add_argument("--out", default="runs/real_data")
    opt = p.parse_args(argv)
    if not (opt.weights or opt.cfg):
        p.error("give --weights (fine-tuning) or --cfg (from scratch), or both")
    opt.variants = variants
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "rows.json"
    records = {r["name"]: r for r in json.loads(saved.read_text())} if saved.exists() else {}
    for seed in opt.seeds:
        for name, (tool, variant, cmd, env) in commands(opt, seed, out).items():
            epochs = read_epochs(out / name / "results.csv")
            if not (name in records and len(epochs) >= opt.epochs):
                times, total = run_timed(cmd, env, out / name, out / f"{name}.log")
                epochs = read_epochs(out / name / "results.csv")
                records[name] = {"name": name, "tool": tool, "variant": variant, "seed": seed, "epochs": epochs,
                                 "seconds": times, "total_s": total, "command": cmd}
            r = records[name]
            print(f"{name}: epoch {len(epochs)} mAP50-95 {epochs[-1][1]:.4f} mAP50 {epochs[-1][0]:.4f}, "
                  f"{r['total_s']:.0f} s", flush=True)
            saved.write_text(json.dumps(list(records.values()), indent=1))
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tool", "variant", "seed", "epoch", "mAP50", "mAP50-95", "seconds"])
        for r in records.values():
            for e, ((m50, m), s) in enumerate(zip(r["epochs"], r["seconds"])):
                w.writerow([r["tool"], r["variant"], r["seed"], e + 1, m50, m, s])
    text = table(list(records.values()), opt.epochs)
    (out / "real_data.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
