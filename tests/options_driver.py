"""train.py under torchrun, instrumented for tests/test_options.py: each rank writes, as JSON, its anchors right
after set-up, hashes of its frozen and trainable parameters before and after training, and the image size of each
training step.

    python -m torch.distributed.run --nproc_per_node 2 tests/options_driver.py <train.py args>
"""

import hashlib
import json
import sys
from pathlib import Path

# run as a script, this folder comes first on sys.path, and its tests/engine would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train  # noqa: E402
from engine.tasks import TASKS  # noqa: E402
from engine.trainer import run  # noqa: E402
from tests.probes import probing  # noqa: E402
from utils.dist import get_rank  # noqa: E402

DetectionTrainer = TASKS["detect"].trainer


def params_hash(model, trainable):
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad == trainable:
            h.update(name.encode())
            h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def on_start(trainer):
    trainer.record = {
        "anchors": trainer.model.model[-1].anchors.tolist(),
        "n_frozen": sum(not p.requires_grad for p in trainer.model.parameters()),
        "frozen_start": params_hash(trainer.model, False),
        "trainable_start": params_hash(trainer.model, True),
        "sizes": [],
    }
    multi_scale = trainer.multi_scale

    def recording(batch, ni):
        batch = multi_scale(batch, ni)
        trainer.record["sizes"].append(list(batch["img"].shape[2:]))
        return batch

    trainer.multi_scale = recording


def on_end(trainer):
    trainer.record.update(frozen_end=params_hash(trainer.model, False),
                          trainable_end=params_hash(trainer.model, True))
    (trainer.save_dir / f"record_rank{max(get_rank(), 0)}.json").write_text(json.dumps(trainer.record))


if __name__ == "__main__":
    run(probing(DetectionTrainer, {"on_train_start": [on_start], "on_train_end": [on_end]}),
        train.parse_opt(sys.argv[1:]))
