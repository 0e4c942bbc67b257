"""Seconds each epoch's first batch keeps the training loop waiting, ours and Ultralytics' (the same data, model,
image size, batch and loader workers). Figures, not assertions.

The wait of epoch 1 is counted from the loop's start (`on_train_start`), that of each later epoch from the end of
the previous one's validation and checkpoints (`on_fit_epoch_end`), to the moment the first batch reaches the step
(our `preprocess_batch`, Ultralytics' `on_train_batch_start`).

    python -m benchmarks.first_batch --data /tmp/shapes/shapes-det.yaml --workers 2
    /tmp/peers-venv/bin/python -m benchmarks.first_batch --tool ultralytics --data /tmp/shapes/shapes-det.yaml
"""

import argparse
import tempfile
import time


class Waits:
    """The clock's marks: `start` at an epoch's boundary, `arrived` at the first batch after it."""

    def __init__(self):
        self.since, self.waits = None, []

    def start(self, *_):
        self.since = time.perf_counter()

    def arrived(self):
        if self.since is not None:
            self.waits.append(time.perf_counter() - self.since)
            self.since = None


def ours(opt, out):
    import train
    from engine.tasks import TASKS
    DetectionTrainer = TASKS["detect"].trainer
    from engine.trainer import run

    waits = Waits()

    class Timed(DetectionTrainer):
        def preprocess_batch(self, batch):
            waits.arrived()
            return super().preprocess_batch(batch)

    args = train.parse_opt(["--data", opt.data, "--cfg", opt.cfg, "--img", str(opt.img), "--epochs", str(opt.epochs),
                            "--batch-size", str(opt.batch), "--workers", str(opt.workers), "--device", "cpu",
                            "--noplots", "--project", out, "--name", "ours"])
    run(Timed, args, callbacks={"on_train_start": [waits.start], "on_fit_epoch_end": [waits.start]})
    return waits.waits


def ultralytics(opt, out):
    from ultralytics import YOLO

    waits = Waits()
    model = YOLO(opt.cfg)
    model.add_callback("on_train_start", waits.start)
    model.add_callback("on_fit_epoch_end", waits.start)
    model.add_callback("on_train_batch_start", lambda trainer: waits.arrived())
    model.train(data=opt.data, imgsz=opt.img, epochs=opt.epochs, batch=opt.batch, workers=opt.workers, device="cpu",
                plots=False, project=out, name="ultralytics", amp=False, verbose=False)
    return waits.waits


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", choices=["ours", "ultralytics"], default="ours")
    p.add_argument("--data", required=True)
    p.add_argument("--cfg", default="yolov8n.yaml")
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    opt = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        waits = (ours if opt.tool == "ours" else ultralytics)(opt, out)
    print(f"{opt.tool}: first-batch wait per epoch (s): {' '.join(f'{w:.2f}' for w in waits)}")


if __name__ == "__main__":
    main()
