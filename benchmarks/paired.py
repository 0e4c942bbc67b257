"""A change's cost, paired: the same training command run by this checkout (HEAD or the working tree) and by a base
commit checked out in a temporary worktree, on the same machine, reported as medians, the ratio and the `--profile`
sections of each side. Run it before resolving any change to the loss, the assigner, the data path or the loop
(CONTRIBUTING.md), and give its figure in the note.

    python ../shared/peers/make_shapes.py --out /tmp/shapes --seed 0     # the benchmark data (256 / 64 images)
    python -m benchmarks.paired --base 9842094 --data /tmp/shapes/shapes-det.yaml --repeats 3
    python -m benchmarks.paired --base main --data /tmp/shapes/shapes-det.yaml --mode together --threads 1

Each side trains on its own copy of the dataset: two versions of the project alternating on one folder would each
reject the other's label cache and rescan it every run, a cost neither has alone.

`--mode alternate` (the default) runs base, head, base, head, ...: the figures a user sees, on a quiet machine.
`--mode together` starts both sides at once, each with `--threads` torch threads: on a machine that other work
shares, both meet the same load at the same moments, so their ratio holds where alternated times drift.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from utils.files import ROOT

SECTIONS = ("startup", "setup", "data_wait", "forward_backward", "optimizer_step", "validation")


def worktree(base, where):
    """`base` checked out (detached) at `where`; the caller removes it."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), base], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return where


def dataset_copy(data, where):
    """A copy of the dataset YAML's folder at `where`, the YAML's `path:` pointing at it. Returns the new YAML."""
    src = Path(data).resolve()
    shutil.copytree(src.parent, where, ignore=shutil.ignore_patterns("*.cache"))
    text = (where / src.name).read_text().replace(str(src.parent), str(where))
    (where / src.name).write_text(text)
    return where / src.name


def command(tree, data, opt, run_dir):
    return [sys.executable, str(tree / "train.py"), "--data", str(data), "--cfg", opt.cfg, "--weights", "",
            "--img", str(opt.img), "--epochs", str(opt.epochs), "--batch-size", str(opt.batch), "--device", "cpu",
            "--noplots", "--profile", "--project", str(run_dir.parent), "--name", run_dir.name, "--exist-ok",
            *opt.args]


def start(tree, cmd, log, threads):
    # train.py run by its path puts its own folder first on sys.path: each side imports its tree's packages
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def finish(proc, t0, run_dir, log):
    """(wall seconds, the profile's seconds by section) of a run that has been started."""
    if proc.wait():
        raise SystemExit(f"error: a run exited {proc.returncode}; see {log}")
    wall = time.perf_counter() - t0
    sections = json.loads((run_dir / "profile.json").read_text())["sections"]
    return wall, {k: sections.get(k, {}).get("s", 0.0) for k in SECTIONS}


def run_pair(sides, opt, out, i):
    """One run of each side, one after the other or together. Returns {side: (wall, sections)}."""
    results, running = {}, []
    for name, (tree, data) in sides.items():
        run_dir = out / "runs" / f"{name}{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        log = out / f"{name}{i}.log"
        proc = start(tree, command(tree, data, opt, run_dir), log, opt.threads)
        running.append((name, proc, time.perf_counter(), run_dir, log))
        if opt.mode == "alternate":
            results[name] = finish(*running.pop()[1:])
    for name, *rest in running:
        results[name] = finish(*rest)
    return results


def report(rows):
    """Medians of each side's wall time and sections, and head / base."""
    med = {}
    for side in ("base", "head"):
        walls = [r[side][0] for r in rows]
        med[side] = {"wall": statistics.median(walls),
                     **{k: statistics.median(r[side][1][k] for r in rows) for k in SECTIONS}}
        print(f"{side}: " + " ".join(f"{w:.1f}" for w in walls) + " s")
    print(f"{'median s':<18}{'base':>9}{'head':>9}{'ratio':>8}")
    for k in ("wall", *SECTIONS):
        b, h = med["base"][k], med["head"][k]
        print(f"{k:<18}{b:>9.2f}{h:>9.2f}{(h / b if b else float('nan')):>8.3f}")
    return med


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit (or branch) to compare with")
    p.add_argument("--data", required=True, help="dataset YAML (make_shapes.py's shapes-det.yaml)")
    p.add_argument("--cfg", default="yolov8n.yaml")
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mode", choices=("alternate", "together"), default="alternate")
    p.add_argument("--threads", type=int, default=0, help="torch threads per run (OMP_NUM_THREADS); 0: the default")
    p.add_argument("--out", default="runs/paired")
    p.add_argument("args", nargs=argparse.REMAINDER, help="after --: more train.py options for both sides")
    opt = p.parse_args(argv)
    opt.args = [a for a in opt.args if a != "--"]
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = worktree(opt.base, tmp / "base")
        try:
            sides = {"base": (base, dataset_copy(opt.data, tmp / "data-base")),
                     "head": (ROOT, dataset_copy(opt.data, tmp / "data-head"))}
            print(f"base {opt.base} at {base}; head {ROOT}; {opt.mode}, {opt.repeats} runs each", flush=True)
            rows = [run_pair(sides, opt, out, i) for i in range(opt.repeats)]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    return report(rows)


if __name__ == "__main__":
    main()
