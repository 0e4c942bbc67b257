"""Datasets at scale (issue 60), ours against Ultralytics: the training dataset's first open (label scan, cache
written) and cached open, and the loader workers' private memory over batches. Each measurement is one whole
process per side and run, the sides alternated, medians reported. The data are COCO128's real training photos and
labels hard-linked N/128 times into a scratch folder (`make`; never commit it), so N images cost no disk.

    python -m benchmarks.scale make --n 12800 --out /tmp/scale/d12800
    python -m benchmarks.scale open --root /tmp/scale/d12800 --repeats 3
    python -m benchmarks.scale memory --root /tmp/scale/d12800 --batches 200 --workers 2
    python -m benchmarks.scale make --task segment --n 12800 --out /tmp/scale/seg12800  # then open/memory --task

`--task segment` gives every COCO128 box a seeded outline of 12-80 points inside it (a jittered ellipse), `--task
pose` 17 keypoints inside it (a third unlabelled, `0 0 0`) and a YAML with `kpt_shape: [17, 3]` and COCO's
`flip_idx`; `open` and `memory` then build each side's dataset for that task (ours with the task's label format,
SegmentLabels or PoseLabels; theirs with cfg.task, which sets use_segments / use_keypoints).
`open` times the dataset as each trainer builds it (ours: YOLODataset as engine/tasks/boxes.py asks; theirs:
ultralytics.data.build_yolo_dataset in train mode), first with its label cache deleted, then with it in place, and
reports each side's peak RSS (the process, and its largest child: our scan forks processes). `memory` starts each
side's training loader (ours: build_dataloader with its GroupedLoader; theirs: its build_dataloader) and reads every
worker's private memory (USS: Private_Clean + Private_Dirty of /proc/PID/smaps_rollup) at every batch of the first
and the last tenth of --batches, and reports each window's highest (a worker's USS rises and falls with the group of
images it holds, so one reading says more about where in its group the worker was than about growth). Without the
peers' venv (../shared/peers/setup.sh) only ours runs.
"""

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

COCO128 = Path(__file__).resolve().parents[1] / "../datasets/coco128"
PEERS = Path(os.environ.get("TMPDIR", "/tmp")) / "peers-venv"
SIDES = ["ours", "ultralytics"]


COCO_FLIP_IDX = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]  # COCO's 17 keypoints, left <-> right


def _outline(rng, cx, cy, w, h):
    """A closed outline of 12-80 points inside the box: an ellipse with jittered angles and radii."""
    n = int(rng.integers(12, 81))
    a = np.sort(rng.uniform(0, 2 * np.pi, n))
    r = rng.uniform(0.6, 1.0, n)
    return np.stack([cx + r * w / 2 * np.cos(a), cy + r * h / 2 * np.sin(a)], 1)


def _keypoints(rng, cx, cy, w, h):
    """17 keypoints (x y v) inside the box, a third of them unlabelled (`0 0 0`, as COCO writes them)."""
    xy = np.stack([rng.uniform(cx - w / 2, cx + w / 2, 17), rng.uniform(cy - h / 2, cy + h / 2, 17)], 1)
    v = rng.integers(1, 3, 17).astype(float)
    off = rng.choice(17, 6, replace=False)
    xy[off], v[off] = 0, 0
    return np.concatenate([xy, v[:, None]], 1)


def task_labels(text, task, seed):
    """A box label file's text as `task`'s: each line with its outline (segment) or 17 keypoints (pose), seeded."""
    if task == "detect":
        return text
    rng, lines = np.random.default_rng(seed), []
    for line in text.splitlines():
        c, *box = line.split()
        cx, cy, w, h = np.array(box[:4], float)
        # the box's part inside the image (some of COCO128's reach a pixel past its edge), kept 1e-5 off the edge
        # so that its 6 written digits stay inside: no label of these sets is clipped
        (x1, y1), (x2, y2) = np.clip([[cx - w / 2, cy - h / 2], [cx + w / 2, cy + h / 2]], 1e-5, 1 - 1e-5)
        cx, cy, w, h = (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1
        extra = (_outline if task == "segment" else _keypoints)(rng, cx, cy, w, h)
        values = np.concatenate([[cx, cy, w, h] if task == "pose" else [], extra.reshape(-1)])
        lines.append(" ".join([c, *(f"{v:.6g}" for v in values)]))
    return "\n".join(lines) + "\n"


def make(n, out, task="detect", src=COCO128):
    """N images (COCO128's train photos, hard-linked in turn) with their labels, and a dataset YAML, under `out`.
    detect: COCO128's own label files; segment and pose: each box's generated outline or keypoints
    (`task_labels`), written once per photo and hard-linked like the photos."""
    src = Path(src).resolve()
    ims = sorted((src / "images" / "train2017").glob("*.jpg"))
    out = Path(out)
    (out / "images" / "train").mkdir(parents=True, exist_ok=True)
    (out / "labels" / "train").mkdir(parents=True, exist_ok=True)
    labels = {}
    for i, im in enumerate(ims):
        lb = src / "labels" / "train2017" / f"{im.stem}.txt"
        if lb.exists() and task != "detect":
            lb = out / f"{im.stem}.{task}.txt"
            lb.write_text(task_labels((src / "labels" / "train2017" / f"{im.stem}.txt").read_text(), task, i))
        labels[im] = lb
    for k in range(n):
        im = ims[k % len(ims)]
        name = f"{im.stem}_{k // len(ims):05d}"
        dst = out / "images" / "train" / f"{name}.jpg"
        if not dst.exists():
            os.link(im, dst)
        if labels[im].exists() and not (out / "labels" / "train" / f"{name}.txt").exists():
            os.link(labels[im], out / "labels" / "train" / f"{name}.txt")
    names = (Path(__file__).resolve().parents[1] / "data" / "coco128.yaml").read_text().split("names:", 1)[1]
    pose = f"kpt_shape: [17, 3]\nflip_idx: {COCO_FLIP_IDX}\n" if task == "pose" else ""
    (out / "data.yaml").write_text(f"path: {out.resolve()}\ntrain: images/train\nval: images/train\n{pose}"
                                   f"names:{names}")
    return out


def _uss_kb(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))


def _peak_mb():
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return round(own), round(children)


def _ours(root, img, task="detect", augment=True, warm=False):
    from data.dataset_yaml import check_det_dataset, check_pose_dataset
    from data.detect_dataset import YOLODataset
    from data.label_formats import DetectLabels, PoseLabels, SegmentLabels
    from utils.files import find_file, yaml_load
    from utils.heap import keep_freed_memory

    keep_freed_memory()  # as every script of ours does first (run_cli)
    d = (check_pose_dataset if task == "pose" else check_det_dataset)(str(Path(root) / "data.yaml"))
    # the label format each task's record gives its trainer (engine/tasks/__init__.py, overlap masks by default)
    labels = {"detect": DetectLabels, "segment": SegmentLabels,
              "pose": lambda: PoseLabels(d["kpt_shape"], d["flip_idx"])}[task]()
    hyp = yaml_load(find_file("hyp.v8.yaml", "data/hyps"))
    if warm:
        return None, 0.0
    t = time.perf_counter()
    ds = YOLODataset(d["train"], imgsz=img, batch_size=16, augment=augment, hyp=hyp, prefix="train: ", nc=d["nc"],
                     names=d["names"], task=labels)
    return ds, time.perf_counter() - t


def _theirs(root, img, task="detect", warm=False):
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    d = check_det_dataset(str(Path(root) / "data.yaml"))
    cfg = get_cfg(overrides={"imgsz": img, "task": task})  # the task sets use_segments / use_keypoints
    if warm:
        return None, 0.0
    t = time.perf_counter()
    ds = build_yolo_dataset(cfg, d["train"], 16, d, mode="train", stride=32)
    return ds, time.perf_counter() - t


def _cpu_s():
    """CPU seconds of this process and its waited-for children (our scan's processes), user and system."""
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def child_open(side, root, img, task):
    (_theirs if side == "ultralytics" else _ours)(root, img, task, warm=True)  # imports, as a trainer has them
    cpu = _cpu_s()
    _, seconds = (_theirs if side == "ultralytics" else _ours)(root, img, task)
    own, children = _peak_mb()
    return {"seconds": seconds, "cpu_s": _cpu_s() - cpu, "peak_mb": own, "child_peak_mb": children}


def child_memory(side, root, img, task, workers, batches):
    """USS of each loader worker after the first batch and after `batches` (MB), and the loader's pace."""
    import psutil
    import torch

    torch.set_num_threads(1)
    if side == "ultralytics":
        from ultralytics.data import build_dataloader

        ds, _ = _theirs(root, img, task)
        loader = build_dataloader(ds, 16, workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")
    else:
        from data import loader as loader_mod
        from data.loader import build_dataloader, set_loader_epoch

        trim, log = loader_mod.release_heap, Path(root) / f"groups-{os.getpid()}.log"
        reading = multiprocessing.Value("i", 0, lock=False)  # the batch the main process is at (workers fork)

        def trim_and_log():  # in the worker, once its group is made and handed on: its USS at the same point each time
            trim()
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {_uss_kb(os.getpid()) / 1024:.1f} {reading.value}\n")

        loader_mod.release_heap = trim_and_log
        ds, _ = _ours(root, img, task)
        loader = build_dataloader(ds, 16, workers, shuffle=True, seed=0)
        set_loader_epoch(loader, 0)
    me = psutil.Process()
    window = max(1, batches // 10)  # a worker's USS rises and falls with the group (of images) it holds
    seen, t = {}, time.perf_counter()
    for k, _ in enumerate(loader, 1):
        if k == 1:
            t = time.perf_counter()
        if k <= window or k > batches - window:
            for p in me.children():
                seen.setdefault(p.pid, [[], []])[k > window].append(_uss_kb(p.pid) / 1024)
        if side == "ours":
            reading.value = k
        if k == batches:
            break
    rate = (batches - 1) * 16 / (time.perf_counter() - t)
    pids = sorted(p for p, (a, b) in seen.items() if a and b)
    groups = {}
    if side == "ours" and log.exists():
        for line in log.read_text().splitlines():
            pid, mb, at = line.split()
            # a group finished once the main process stopped reading (batch `batches`) still has its previous
            # group's batches in its queue, unsent: marked, it measures the benchmark's end, not the loader
            groups.setdefault(int(pid), []).append(f"{float(mb):.0f}" + ("*" if int(at) >= batches else ""))
        log.unlink()
    return {"after_groups_mb": groups,
            "first_mb": [round(max(seen[p][0])) for p in pids], "last_mb": [round(max(seen[p][1])) for p in pids],
            "window": window, "main_uss_mb": round(_uss_kb(os.getpid()) / 1024), "img_per_s": round(rate, 1)}


def _peer_env():
    env = dict(os.environ)
    script = PEERS / "peer-env.sh"
    for line in script.read_text().splitlines() if script.exists() else []:
        for word in line.removeprefix("export ").split():
            k, _, v = word.partition("=")
            env[k] = v
    return env


def run_child(side, *args):
    return run_side("benchmarks.scale", side, *args)


def run_side(module, side, *args):
    """`python -m module _child SIDE ARGS...` as one side's process (Ultralytics' in the peers' venv, with its
    environment) from the repository's root; the JSON of its last line."""
    python = str(PEERS / "bin" / "python") if side == "ultralytics" else sys.executable
    env = _peer_env() if side == "ultralytics" else dict(os.environ)
    out = subprocess.run([python, "-m", module, "_child", side, *map(str, args)], capture_output=True,
                         text=True, env=env, timeout=3600, cwd=Path(__file__).resolve().parents[1])
    if out.returncode:
        raise SystemExit(f"error: the {side} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _caches(root):
    """Both tools' label caches of the split (ours .yolo-engine.cache, theirs .cache)."""
    return [Path(root) / "labels" / "train.yolo-engine.cache", Path(root) / "labels" / "train.cache"]


def bench_open(root, img, task, repeats, sides):
    runs = {(s, k): [] for s in sides for k in ("first", "cached")}
    for _ in range(repeats):
        for s in sides:
            for c in _caches(root):
                c.unlink(missing_ok=True)
            runs[s, "first"].append(run_child(s, "open", root, img, task))
            runs[s, "cached"].append(run_child(s, "open", root, img, task))
    n = len(list((Path(root) / "images" / "train").iterdir()))
    for (s, k), v in runs.items():
        sec = statistics.median(r["seconds"] for r in v)
        cpu = statistics.median(r["cpu_s"] for r in v)
        peak = max(r["peak_mb"] for r in v)
        child = max(r["child_peak_mb"] for r in v)
        each = " ".join(f"{r['seconds']:.2f}" for r in v)
        print(f"{s:<12} {k:<7} {n:>7} images {sec:8.3f} s ({sec / n * 1e3:.3f} ms/img; runs {each}), CPU {cpu:.2f} s "
              f"({cpu / n * 1e3:.3f} ms/img); peak RSS {peak} MB, largest child {child} MB")
    if len(sides) == 2:
        for k in ("first", "cached"):
            a, b = (statistics.median(r["seconds"] for r in runs[s, k]) for s in sides)
            ca, cb = (statistics.median(r["cpu_s"] for r in runs[s, k]) for s in sides)
            print(f"ours / ultralytics {k}: {a / b:.2f}x wall, {ca / cb:.2f}x CPU")


def bench_memory(root, img, task, workers, batches, sides):
    for s in sides:
        r = run_child(s, "memory", root, img, task, workers, batches)
        growth = [b / a - 1 for a, b in zip(r["first_mb"], r["last_mb"])]
        w = r["window"]
        print(f"{s:<12} workers' highest USS over batches 1-{w}: {r['first_mb']} MB, over batches {batches - w + 1}-"
              f"{batches}: {r['last_mb']} MB ({max(growth) * 100:+.0f} % at most); main process USS "
              f"{r['main_uss_mb']} MB; {r['img_per_s']} img/s")
        for pid, mbs in r.get("after_groups_mb", {}).items():
            print(f"{'':<12} worker {pid}: USS after each group it made: {' '.join(mbs)} MB (*: after batch "
                  f"{batches})")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        side, what, *args = sys.argv[2:]
        if what == "open":
            print(json.dumps(child_open(side, args[0], int(args[1]), args[2])))
        else:
            print(json.dumps(child_memory(side, args[0], int(args[1]), args[2], int(args[3]), int(args[4]))))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["make", "open", "memory"])
    p.add_argument("--n", type=int, default=12800, help="make: images")
    p.add_argument("--out", "--root", dest="root", default="/tmp/scale/d12800")
    p.add_argument("--task", choices=["detect", "segment", "pose"], default="detect",
                   help="make: the labels written; open, memory: the labels each side's dataset reads")
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=None)
    opt = p.parse_args()
    sides = opt.sides or (SIDES if (PEERS / "bin" / "python").exists() else SIDES[:1])
    if opt.what == "make":
        print(make(opt.n, opt.root, opt.task))
    elif opt.what == "open":
        bench_open(opt.root, opt.img, opt.task, opt.repeats, sides)
    else:
        bench_memory(opt.root, opt.img, opt.task, opt.workers, opt.batches, sides)


if __name__ == "__main__":
    main()
