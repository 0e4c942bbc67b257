"""What one training step of yolov8n makes the host wait for, counted on the CPU (benchmarks/sync_counter.py) between
optimizer steps of a real run: the criterion's three reads (the most targets in an image, the anchors inside a box,
the positives) and the progress bar's one copy of the mean losses. Pinned, so that one added back fails here; the
figures with both tools are in docs/performance.md ("Host-device synchronisations")."""

import pytest

import train
from benchmarks.sync_counter import SyncCounter
from engine.tasks import TASKS
from engine.trainer import run

DetectionTrainer = TASKS["detect"].trainer

STEP = {"_local_scalar_dense": 1, "nonzero": 2, "tolist": 1}


class _Enough(BaseException):  # a callback's Exception would be a warning (engine/callbacks.py); this stops the run
    pass


def test_a_training_step_reads_from_the_device_four_times(shapes_detect, tmp_path):
    hyp = tmp_path / "hyp.yaml"
    hyp.write_text("nbs: 4\n")  # every batch of 4 is an optimizer step
    args = ["--data", str(shapes_detect), "--cfg", "yolov8n.yaml", "--imgsz", "64", "--batch-size", "4", "--epochs",
            "1", "--workers", "0", "--device", "cpu", "--amp", "off", "--noplots", "--hyp", str(hyp),
            "--project", str(tmp_path), "--name", "exp"]
    done = []

    def stop_after_four(event):
        done.append(event.batch)
        if len(done) == 4:
            raise _Enough

    with SyncCounter() as counter, pytest.raises(_Enough):
        run(DetectionTrainer, train.parse_opt(args), callbacks={"on_train_batch_end": [stop_after_four]})
    steps = counter.intervals()
    assert len(steps) == 3  # between the 4 optimizer steps (the whole epoch's images were loaded before the first)
    for ops, where in steps:
        assert dict(ops) == STEP, dict(where)
