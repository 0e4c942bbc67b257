"""Command lines a run prints for its user to copy: how to resume it, and what to run on its weights next."""

import shlex
import sys
from pathlib import Path

from utils import dist as du
from utils.files import ROOT


def shown(path):
    """A path as a user types it: relative to the working directory when inside it, quoted for the shell."""
    p = Path(path).resolve()
    try:
        p = p.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.quote(str(p))


def resume_command(last):
    """The command line that continues from `last`: this script, under the launcher it was started by."""
    script, path = shown(sys.argv[0]), shown(last)
    if not du.is_distributed():
        return f"python {script} --resume {path}"
    nodes = "" if du.get_world_size() == du.get_local_world_size() else " --nnodes ... (on every machine)"
    return f"python -m torch.distributed.run --nproc_per_node {du.get_local_world_size()}{nodes} {script} " \
           f"--resume {path}"


def next_commands(scripts, weights, data, source, imgsz):
    """Validate, predict and export commands for a finished run's weights. `scripts` is the task's (val, predict)
    pair of script paths under the repository root; `data` the --data given, `source` what to predict on."""
    val, predict = (shown(ROOT / s) for s in scripts)
    w, img = shown(weights), f"--img {imgsz}"
    data = shown(data) if Path(data).exists() else shlex.quote(str(data))  # else a name found under data/
    return [f"python {val} --weights {w} --data {data} {img}",
            f"python {predict} --weights {w} --source {source} {img}",
            f"python {shown(ROOT / 'export.py')} --weights {w} --include onnx {img}"]
