"""Data that costs more than it should, or speaks to the terminal (docs/safety.md, the budget): image bombs and
oversized or sparse label files in a dataset are named skips; FIFOs and bombs in a predict folder are named skips
and never saved; a planted label cache does not replace the labels; names with control characters are refused
or escaped. COCO-sized files stay far inside."""

import os
import struct

import cv2
import numpy as np
import pytest
import yaml

from data import label_cache
from data.dataset_yaml import DatasetError, check_det_dataset
from data.detect_dataset import YOLODataset
from data.labels import write_problems
from models.checkpoints import model_to_ckpt, save_checkpoint
from models.yolo import DetectionModel
from tests.capped import run_capped


def _bomb():
    """629 bytes: a JPEG cut short after a frame header declaring 20000 x 20000 (OpenCV decodes it to 1.2 GB)."""
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    data = bytearray(buf.tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 20000, 20000)
    return bytes(data[:629])


def _dataset(root):
    return YOLODataset(str(root / "images" / "train"), imgsz=96, nc=3)


def test_bombs_and_oversized_labels_are_named_skips(det_copy):
    img, lb = det_copy / "images" / "train", det_copy / "labels" / "train"
    (img / "00000.jpg").write_bytes(_bomb())
    with open(lb / "00001.txt", "wb") as f:  # 1 GiB of apparent size, all of it a hole: nothing on disk
        f.truncate(1 << 30)
    ds = _dataset(det_copy)
    assert ds.stats["images"] == 14 and ds.stats["skipped"] == 2
    assert any("00000.jpg: skipped, 20000x20000 = 400000000 pixels, over the 89478485-pixel limit" in p
               for p in ds.problems)
    assert any("00001.txt: larger than 4194304 bytes" in p for p in ds.problems), ds.problems


def test_coco_sized_files_are_kept(det_copy):
    """A 640 x 640 image with 100 objects of 1000-point polygons (1.8 MB of labels, under half the bound)."""
    img, lb = det_copy / "images" / "train", det_copy / "labels" / "train"
    cv2.imwrite(str(img / "00000.jpg"), np.full((640, 640, 3), 80, np.uint8))
    t = np.linspace(0, 2 * np.pi, 1000, endpoint=False)
    ring = np.stack([0.5 + 0.3 * np.cos(t), 0.5 + 0.3 * np.sin(t)], 1).ravel()
    line = "0 " + " ".join(f"{v:.6f}" for v in ring) + "\n"
    (lb / "00000.txt").write_text(line * 100)
    assert (lb / "00000.txt").stat().st_size > 1_700_000
    ds = YOLODataset(str(img), imgsz=96, nc=3, task="segment")
    i = ds.im_files.index(str(img / "00000.jpg"))
    assert ds.stats["skipped"] == 0 and ds.labels[i]["shape"] == (640, 640) and len(ds.labels[i]["cls"]) == 1


def test_a_planted_label_cache_does_not_replace_the_labels(det_copy, yolo_log, monkeypatch, tmp_path):
    """A cache with the dataset's own hash, written under another user's key (shipped with the dataset), and one
    written under this user's key whose entries name files outside the dataset: each is ignored with one warning,
    and the labels come from the label files."""
    honest = _dataset(det_copy)
    cache = det_copy / "labels" / "train.yolo-engine.cache"
    doc = label_cache._encode(label_cache._read_verified(cache))
    packed = doc["data"]["labels"]  # every object becomes class 2
    packed["cls"] = np.full((len(honest.labels.cls), 1), 2.0, np.float32)

    other_key = tmp_path / "elsewhere"
    monkeypatch.setenv(label_cache.KEY_ENV, str(other_key))
    label_cache.write_signed(cache, doc, label_cache.cache_key())
    monkeypatch.undo()
    _check_rebuilt(det_copy, honest, yolo_log, "not written with this user's key")

    packed["im_files"][0] = "/etc/passwd"
    label_cache.write_signed(cache, doc, label_cache.cache_key())
    _check_rebuilt(det_copy, honest, yolo_log, "its entries name files outside the dataset")


def _check_rebuilt(root, honest, log, why):
    log.clear()
    ds = _dataset(root)
    assert not ds.stats["cached"] and [m for m in log if "ignoring label cache" in m and why in m]
    assert [lb["cls"].tolist() for lb in ds.labels] == [lb["cls"].tolist() for lb in honest.labels]
    assert "/etc/passwd" not in ds.im_files


def test_names_that_would_drive_a_terminal(tmp_path, det_copy, yolo_log):
    """A class name with an escape sequence is refused; a file name with one (or a newline) is printed and saved
    escaped, one line per problem."""
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump({"path": str(det_copy), "train": "images/train", "val": "images/val",
                                 "names": ["ok", "\x1b]0;pwned\x07\x1b[2J", "c"]}))
    with pytest.raises(DatasetError, match=r"the name of class 1 holds control characters \(\\x1b\]0;pwned"):
        check_det_dataset(str(f))
    evil = det_copy / "images" / "train" / "a\x1b[2J\rAll checks passed\nb.jpg"
    evil.write_bytes(b"not an image")
    ds = _dataset(det_copy)
    shown = [m for m in yolo_log if "All checks passed" in m]
    assert shown and all("\x1b" not in m and "\r" not in m and "\n" not in m for m in shown)
    write_problems(tmp_path / "run", {"train": ds.problems})
    lines = (tmp_path / "run" / "data_problems.txt").read_text().splitlines()
    assert len(lines) == len(ds.problems) and any("a\\x1b[2J\\rAll checks passed\\nb.jpg" in x for x in lines)


def test_predict_skips_fifos_and_bombs_by_name(tmp_path):
    """A folder holding a FIFO named like an image (which would block the reader forever), a 629-byte bomb and a
    real image: the first two are skipped by name, nothing of the bomb is saved, the real image is predicted; in a
    process whose memory is capped (the bomb decoded and drawn: 2.9 GB)."""
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "a_pipe.jpg")
    (src / "b_bomb.jpg").write_bytes(_bomb())
    cv2.imwrite(str(src / "c_real.jpg"), np.full((64, 80, 3), 127, np.uint8))
    weights = tmp_path / "w.pt"
    save_checkpoint({"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=3)), "ema": None}, weights)
    r = run_capped(["detect.py", "--weights", str(weights), "--source", str(src), "--device", "cpu", "--imgsz", "64",
                    "--project", str(tmp_path / "runs")], timeout=240)
    assert r.returncode == 0 and not r.errors, r.stderr[-2000:]
    said = r.stdout + r.stderr
    assert "skipping " + str(src / "a_pipe.jpg") + ": it is not a regular file" in said
    assert "skipping image " + str(src / "b_bomb.jpg") + ": 20000x20000 = 400000000 pixels" in said
    assert sorted(p.name for p in (tmp_path / "runs" / "exp").iterdir()) == ["c_real.jpg"]
    assert r.peak < 1 << 30
