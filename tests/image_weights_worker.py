"""The worker of tests/test_options.py's --image-weights DDP check, in its own light module: spawned processes
import the module of the function they run."""

import json
from pathlib import Path

import numpy as np


def weighted_shares(rank, world_size, out_dir):
    """Rank 0's maps_fn is the only one that matters: the others would give other weights if they were used."""
    from data.image_weights import ImageWeightSampler

    labels = [np.array([0.0]), np.array([0.0, 0.0]), np.array([1.0]), np.array([2.0, 0.0]), np.zeros(0)] * 4
    maps = np.array([0.5, 0.0, 0.2]) if rank == 0 else np.array([0.0, 0.9, 0.9])
    s = ImageWeightSampler(labels, 3, world_size, rank, seed=3, maps_fn=lambda: maps)
    s.set_epoch(1)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"weights": list(s.weights), "idx": list(s)}))
