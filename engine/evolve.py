"""--evolve N: genetic hyperparameter search, YOLOv5's way, in one process.

Each generation picks a parent from the best rows of `evolve.csv` (weighted by fitness; the base hyp before any row
exists), mutates it, trains a full run with it (validating and saving only at the end), and appends one row: the
run's final metrics and the hyperparameters it used. At the end the best row is written as `hyp_evolve.yaml`.

It refuses DDP, as the official repositories do: every generation is a whole training run whose result decides
the next, so the useful parallelism is one evolution per GPU, not one evolution spread over several.
"""

import csv
import dataclasses
from functools import partial
from pathlib import Path

import numpy as np

from engine.hyp import default_hyp_file, load_hyp
from engine.resume import weights_own_model
from engine.trainer import run as run_training
from models.checkpoints import model_yaml
from utils import dist as du
from utils.errors import BadOption, Interrupted
from utils.files import increment_path, yaml_save
from utils.log import LOGGER

# hyp key: (mutation gain, lower bound, upper bound); YOLOv5's search space plus YOLOv8's dfl gain
META = {
    "lr0": (1, 1e-5, 1e-1), "lrf": (1, 0.01, 1.0), "momentum": (0.3, 0.6, 0.98), "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0), "warmup_momentum": (1, 0.0, 0.95), "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2), "cls": (1, 0.2, 4.0), "cls_pw": (1, 0.5, 2.0), "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0), "anchor_t": (1, 2.0, 8.0), "fl_gamma": (0, 0.0, 2.0),
    "dfl": (1, 0.5, 3.0), "hsv_h": (1, 0.0, 0.1), "hsv_s": (1, 0.0, 0.9), "hsv_v": (1, 0.0, 0.9),
    "degrees": (1, 0.0, 45.0), "translate": (1, 0.0, 0.9), "scale": (1, 0.0, 0.9), "shear": (1, 0.0, 10.0),
    "perspective": (0, 0.0, 0.001), "flipud": (1, 0.0, 1.0), "fliplr": (0, 0.0, 1.0), "mosaic": (1, 0.0, 1.0),
    "mixup": (1, 0.0, 1.0), "copy_paste": (1, 0.0, 1.0),
}
MUTATION_PROB, SIGMA, N_PARENTS = 0.8, 0.2, 5


def read_rows(csv_file):
    if not Path(csv_file).exists():
        return []
    with open(csv_file) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def select_parent(rows, keys, rng):
    """One of the best N_PARENTS rows, drawn with weights rising with fitness."""
    best = sorted(rows, key=lambda r: r["fitness"], reverse=True)[:N_PARENTS]
    w = np.array([r["fitness"] for r in best])
    w = w - w.min() + 1e-6
    parent = best[rng.choice(len(best), p=w / w.sum())]
    return {k: parent[k] for k in keys}


def mutate(hyp, keys, rng):
    """Multiply each key by a random factor in [0.3, 3] (most near 1), then clip it to its bounds."""
    gains = np.array([META[k][0] for k in keys], dtype=float)
    v = np.ones(len(keys))
    while (v == 1).all():  # a generation that changed nothing would waste a training run
        v = (gains * (rng.random(len(keys)) < MUTATION_PROB) * rng.standard_normal(len(keys)) * rng.random() * SIGMA
             + 1).clip(0.3, 3.0)
    out = dict(hyp)
    for k, f in zip(keys, v):
        out[k] = round(float(np.clip(hyp[k] * f, META[k][1], META[k][2])), 5)
    return out


def append_row(csv_file, metrics, hyp, keys):
    row = {**{k: float(v) for k, v in metrics.items()}, **{k: hyp[k] for k in keys}}
    new = not Path(csv_file).exists()
    with open(csv_file, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def train_or_evolve(trainer_cls, parsed, callbacks=None):
    """A box task's train script's `main`: --evolve's search (`evolve`), or one run (engine/trainer.run) of `parsed`
    (utils/cli.Parsed) with `callbacks`."""
    if parsed.opt.evolve:
        return evolve(trainer_cls, parsed, partial(run_training, callbacks=callbacks))
    return run_training(trainer_cls, parsed, callbacks)


def evolve(trainer_cls, parsed, run):
    """Run --evolve generations of `run(trainer_cls, options, given=...)`, each with its own copy of the options
    (`parsed`: a train script's parsed command line, utils/cli.Parsed); returns the path of the best hyp YAML."""
    opt, given = parsed
    if du.get_world_size() > 1:
        raise BadOption("--evolve runs in a single process (each generation is a whole training run): launch it "
                        "without torchrun, one evolution per GPU with --device")
    if opt.resume:  # a generation's own --resume would continue, or refuse, an earlier search's generation
        raise BadOption("--evolve starts a new search of new runs; it does not take --resume")
    # the model whose default hyp the search starts from
    opt = weights_own_model(trainer_cls.options.from_values(opt), given)
    base = _base_hyp(opt)  # a mistake in --hyp ends the command before a folder is made
    save_dir = increment_path(Path(opt.project or "runs/evolve") / opt.name, exist_ok=opt.exist_ok, mkdir=True)
    csv_file = save_dir / "evolve.csv"
    keys = [k for k in META if k in base]
    rng = np.random.default_rng(opt.seed)  # its own generator: each run re-seeds the global ones
    for g in range(opt.evolve):
        rows = read_rows(csv_file)
        parent = {**base, **select_parent(rows, keys, rng)} if rows else base
        hyp = mutate(parent, keys, rng)
        hyp_file = save_dir / f"gen{g}_hyp.yaml"
        yaml_save(hyp_file, hyp)
        # validate and save the last epoch only; a generation is judged by its fitness row, not by pictures
        gen_opt = dataclasses.replace(opt, evolve=None, noval=True, nosave=True, noplots=True, hyp=str(hyp_file),
                                      project=str(save_dir), name=f"gen{g}", exist_ok=False)
        LOGGER.info(f"evolve: generation {g + 1}/{opt.evolve}")
        try:
            _, metrics = run(trainer_cls, gen_opt, given=given)
        except Interrupted as e:  # the trainer's resume line continues this generation's training, not the search
            raise Interrupted(e.code - 128, f"evolve: stopped in generation {g + 1}/{opt.evolve}; {csv_file} holds "
                                            f"the {g} finished ones (an evolution does not resume)") from None
        append_row(csv_file, metrics, hyp, keys)
    rows = read_rows(csv_file)
    best = max(rows, key=lambda r: r["fitness"])
    out = save_dir / "hyp_evolve.yaml"
    yaml_save(out, {**base, **{k: best[k] for k in keys}})
    LOGGER.info(f"evolve: {len(rows)} generations, best fitness {best['fitness']:.4f}; hyp saved to {out}")
    return out


def _base_hyp(opt):
    """The hyp the trainer would load (engine/hyp.run_hyp): --hyp completed from the model's default hyp file."""
    return load_hyp(opt.hyp, default_hyp_file(model_yaml(opt.cfg))[0])
