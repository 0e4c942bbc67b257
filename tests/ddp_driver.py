"""Run a task's training under torchrun with instrumentation the DDP tests read back: each rank writes the hash
of its final weights, how many checkpoints it saved, how many of its batches had no labels, and its EMA weights.

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_driver.py train|segment|pose|obb|classify <script args>
"""

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.trainer import run  # noqa: E402
from tests.probes import probing  # noqa: E402
from utils.dist import get_rank  # noqa: E402


def weights_hash(model):
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def instrument(trainer):
    trainer.n_saves, trainer.n_empty = 0, 0
    save, preprocess = trainer.checkpointer.save, trainer.preprocess_batch

    def counting_save(*a, **k):
        trainer.n_saves += 1
        return save(*a, **k)

    def counting_preprocess(batch):
        if "targets" in batch and len(batch["targets"]) == 0:
            trainer.n_empty += 1
        return preprocess(batch)

    trainer.checkpointer.save, trainer.preprocess_batch = counting_save, counting_preprocess


def report(trainer):
    rank = max(get_rank(), 0)
    d = trainer.save_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / f"weights_rank{rank}.sha").write_text(weights_hash(trainer.model))
    (d / f"saved_rank{rank}.txt").write_text(str(int(trainer.n_saves > 0)))
    (d / f"empty_batches_rank{rank}.txt").write_text(str(trainer.n_empty))
    torch.save(trainer.optim.ema.ema.state_dict(), d / f"ema_rank{rank}.pt")  # the weights the last validation used


def main():
    task, args = sys.argv[1], sys.argv[2:]
    if task == "train":
        import train as script
        from engine.tasks import TASKS
        trainer_cls = TASKS["detect"].trainer
    elif task == "segment":
        from engine.tasks import TASKS
        trainer_cls = TASKS["segment"].trainer
        from segment import train as script
    elif task == "pose":
        from engine.tasks import TASKS
        trainer_cls = TASKS["pose"].trainer
        from pose import train as script
    elif task == "obb":
        from engine.tasks import TASKS
        from obb import train as script
        trainer_cls = TASKS["obb"].trainer
    else:
        from classify import train as script
        from engine.tasks import TASKS
        trainer_cls = TASKS["classify"].trainer
    run(probing(trainer_cls, {"on_train_start": [instrument], "on_train_end": [report]}), script.parse_opt(args))


if __name__ == "__main__":
    main()
