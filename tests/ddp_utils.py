"""Run a function in N gloo processes (torch.multiprocessing), the way torchrun would set them up."""

import os
import socket
import sys
from pathlib import Path

import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid):
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...), or None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid):
    """The pids of a process's children, theirs, and so on (Linux /proc); its children come first."""
    children = {}
    for entry in Path("/proc").iterdir():
        fields = proc_stat(entry.name) if entry.name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _entry(rank, world_size, port, fn, args):
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    from utils.dist import cleanup_ddp, setup_ddp

    setup_ddp(torch.device("cpu"))
    try:
        fn(rank, world_size, *args)
    finally:
        cleanup_ddp()
    # Done and out of the group: leave without the interpreter's finalisation, which now and then ends a spawned
    # gloo worker in std::terminate (SIGABRT, "terminate called without an active exception") after its work is
    # complete; the scripts' own exit under torchrun is what the DDP and elastic tests check.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world_size, *args):
    """fn(rank, world_size, *args) must be a module-level function (it is pickled)."""
    mp.spawn(_entry, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


def train_mode(model, freeze_bn):
    """Train mode; with freeze_bn, BatchNorm uses its running statistics, because per-rank batch statistics
    differ from the global batch's (unless SyncBatchNorm is on) and the gradient comparison would fail."""
    import torch.nn as nn

    model.train()
    if freeze_bn:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
    return model
