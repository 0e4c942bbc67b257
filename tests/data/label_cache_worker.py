"""The worker of tests/data/test_label_cache.py's two-machine check, in a light module: spawned processes import the
module of the function they run."""

import json
import os
from pathlib import Path

import numpy as np


def two_machines(rank, world_size, out_dir):
    """Each rank plays local rank 0 of its own machine, with its own configuration folder (its own key): rank 0
    writes a cache into the shared folder, rank 1 reads it."""
    os.environ["LOCAL_RANK"] = "0"
    os.environ["YOLO_ENGINE_CONFIG_DIR"] = str(Path(out_dir) / f"config{rank}")
    from data import label_cache
    from utils import dist as du

    shared = Path(out_dir) / "train.yolo-engine.cache"
    if rank == 0:
        label_cache.save_cache(shared, {"labels": np.arange(3)}, "h")
    du.barrier()
    back = label_cache.load_cache(shared, "h")
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({
        "job_key": label_cache.cache_key().hex(), "own_key": label_cache.own_key().hex(),
        "read": None if back is None else back["labels"].tolist()}))
