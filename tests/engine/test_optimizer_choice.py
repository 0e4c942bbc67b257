"""`--optimizer auto`: SGD at the hyp's lr0 for long runs, else AdamW at the Ultralytics fit 0.002 * 5 / (4 + nc)
times the hyp's `lr_auto_gain` when training from scratch (the fit itself when fine-tuning `--weights`). An
explicit optimizer takes the hyp's lr0 and momentum, gain or not."""

import pytest

import train
from engine.hyp import read_hyp
from utils.torch_utils import resolve_optimizer

HYP = (0.01, 0.937)  # lr0, momentum


def test_auto_short_run_is_adamw_at_the_fit_times_the_gain():
    assert resolve_optimizer("auto", *HYP, 3, 500) == ("AdamW", pytest.approx(0.01 / 7, abs=1e-6), 0.9)
    assert resolve_optimizer("auto", *HYP, 3, 500, lr_gain=6.0) == ("AdamW", pytest.approx(0.06 / 7, abs=1e-6), 0.9)
    assert resolve_optimizer("auto", *HYP, 80, 500, lr_gain=6.0)[1] == pytest.approx(0.06 / 84, abs=1e-6)


def test_auto_long_run_and_explicit_optimizers_ignore_the_gain():
    assert resolve_optimizer("auto", *HYP, 3, 20000, lr_gain=6.0) == ("SGD", 0.01, 0.937)
    assert resolve_optimizer("AdamW", *HYP, 3, 500, lr_gain=6.0) == ("AdamW", 0.01, 0.937)


def test_the_gain_is_a_hyperparameter_of_each_model_family():
    gains = {f: read_hyp(f)["lr_auto_gain"] for f in ("hyp.scratch-low.yaml", "hyp.scratch-high.yaml", "hyp.v7.yaml",
                                                     "hyp.v7-tiny.yaml", "hyp.v8.yaml", "hyp.cls.yaml")}
    assert gains == {"hyp.scratch-low.yaml": 10.0, "hyp.scratch-high.yaml": 10.0, "hyp.v7.yaml": 10.0,
                     "hyp.v7-tiny.yaml": 10.0, "hyp.v8.yaml": 4.0, "hyp.cls.yaml": 1.0}


def test_yolov5_from_scratch_trains_at_the_scaled_lr_and_fine_tuning_at_the_fit(shapes_detect, tmp_path):
    args = ["--data", str(shapes_detect), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "8",
            "--epochs", "1", "--workers", "0", "--device", "cpu", "--noplots", "--project", str(tmp_path)]
    scratch, _ = train.main(train.parse_opt([*args, "--name", "scratch"]))
    fit = 0.002 * 5 / (4 + scratch.nc)
    optim = scratch.optim
    assert type(optim.optimizer).__name__ == "AdamW"
    assert optim.schedule.lr0 == pytest.approx(fit * scratch.hyp["lr_auto_gain"], abs=1e-6)
    assert scratch.hyp["lr_auto_gain"] == 10.0
    assert [g["initial_lr"] for g in optim.optimizer.param_groups] == [pytest.approx(optim.schedule.lr0)] * 3
    weights = str(scratch.save_dir / "weights" / "last.pt")
    tuned, _ = train.main(train.parse_opt([*args, "--name", "tuned", "--weights", weights]))
    assert tuned.optim.schedule.lr0 == pytest.approx(fit, abs=1e-6)
