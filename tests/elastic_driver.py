"""train.py with a planned SIGKILL, for the fault-tolerance tests (run under torchrun or torch.distributed.launch).

    python -m torch.distributed.run --max-restarts 1 ... tests/elastic_driver.py <train.py args>

On the first start only (TORCHELASTIC_RESTART_COUNT 0), the process of global rank KILL_RANK kills itself with
SIGKILL, as the OOM killer or a lost node would: KILL_AT="epoch:batch" before it runs that batch, or, with
KILL_IN_SAVE=1, inside the first checkpoint write at or after that point, leaving a partial temp file beside
last.pt. At the end, rank 0 writes the fp32 weights of the model and its EMA to <run>/final_weights.pt, and each
rank appends "restart epoch batch time" of where and when it started training to <run>/starts_rank<r>.txt, and
the killed process writes the time of its death to <run>/killed_at.txt. Each rank also writes which tracker packages
it imported to <run>/trackers_rank<r>.txt (only rank 0 may talk to a tracker).
"""

import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

# run as a script, this folder comes first on sys.path, and its tests/engine would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import engine.checkpointer as checkpointer_module  # noqa: E402
import train  # noqa: E402
from engine.tasks import TASKS  # noqa: E402
from engine.trainer import run  # noqa: E402
from tests.probes import probing  # noqa: E402
from utils import dist as du  # noqa: E402
from utils.run import run_cli  # noqa: E402

DetectionTrainer = TASKS["detect"].trainer


def _die(run_dir):
    (run_dir / "killed_at.txt").write_text(f"{time.time():.3f}")
    os.kill(os.getpid(), signal.SIGKILL)


def arm(trainer):
    rank, restart = max(du.get_rank(), 0), du.get_restart_count()
    trainer.save_dir.mkdir(parents=True, exist_ok=True)
    with open(trainer.save_dir / f"starts_rank{rank}.txt", "a") as f:
        f.write(f"{restart} {trainer.state.epoch} {trainer.state.batch} {time.time():.3f}\n")
    if restart or rank != int(os.environ.get("KILL_RANK", -1)):
        return
    epoch, batch = (int(v) for v in os.environ["KILL_AT"].split(":"))
    preprocess, save = trainer.preprocess_batch, checkpointer_module.save_checkpoint
    seen = {"n": 0}

    def reached():
        return seen["n"] >= epoch * trainer.data_plan.batches_per_epoch + batch

    def counting_preprocess(b):
        if reached() and not os.environ.get("KILL_IN_SAVE"):
            _die(trainer.save_dir)
        seen["n"] += 1
        return preprocess(b)

    def partial_save(obj, path):
        if reached() and path.name == "last.pt":
            tmp = path.with_name(f".{path.name}.killed.tmp")
            tmp.write_bytes(b"partial")
            _die(trainer.save_dir)
        return save(obj, path)

    trainer.preprocess_batch = counting_preprocess
    checkpointer_module.save_checkpoint = partial_save


def report(trainer):
    rank = max(du.get_rank(), 0)
    imported = [m for m in ("wandb", "mlflow", "clearml", "comet_ml") if m in sys.modules]
    (trainer.save_dir / f"trackers_rank{rank}.txt").write_text(" ".join(imported))
    if du.is_main_process():
        weights = {"model": trainer.model.state_dict(), "ema": trainer.optim.ema.ema.state_dict()}
        torch.save({k: {n: t.detach().float().cpu() for n, t in sd.items()} for k, sd in weights.items()},
                   trainer.save_dir / "final_weights.pt")


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a test that times out asks every worker where it is
    # (SIGUSR1 would ask the training loop to stop)
    # as train.py's own __main__ does, so that what a worker prints when it fails is what a user would see
    probed = probing(DetectionTrainer, {"on_train_start": [arm], "on_train_end": [report]})
    run_cli(lambda opt: run(probed, opt),
            lambda: train.parse_opt(sys.argv[1:]))
