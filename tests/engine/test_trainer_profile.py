"""--profile end to end: a 1-epoch run writes profile.json with every section, the loop's sections measured, and
the rows adding up to the wall time. Without --profile there is no file (tests/test_train.py)."""

import json

import pytest

import train
from utils.profiling import ROWS


def test_profile_json_of_a_tiny_run(shapes_detect, tmp_path):
    args = ["--data", str(shapes_detect), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "8",
            "--epochs", "1", "--workers", "0", "--device", "cpu", "--noplots", "--project", str(tmp_path),
            "--name", "exp", "--profile"]
    trainer, _ = train.main(train.parse_opt(args))
    summary = json.loads((trainer.save_dir / "profile.json").read_text())
    sections = summary["sections"]
    assert list(sections) == list(ROWS)
    for key in ("startup", "setup", "data_wait", "forward_backward", "optimizer_step", "validation", "checkpoints",
                "plots_logs"):
        assert sections[key]["s"] > 0, key
    assert sections["other"]["s"] >= 0
    assert sum(v["s"] for v in sections.values()) == pytest.approx(summary["wall_s"], abs=1e-3)
    n_train = len(trainer.train_set)
    assert summary["train_images"] == n_train and summary["batches"] == -(-n_train // 8)
    assert summary["train_img_per_s"] > 0
