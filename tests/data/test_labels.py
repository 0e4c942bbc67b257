import os
import signal

import cv2
import numpy as np
import pytest

from data import label_cache
from data import labels as labels_mod
from data.detect_dataset import YOLODataset
from data.image_files import img2label_paths, scan_files


def _dataset(root, **kw):
    return YOLODataset(str(root / "images" / "train"), imgsz=96, nc=3, **kw)


def test_label_cache_built_once_reused_and_rebuilt(det_copy, yolo_log):
    ds = _dataset(det_copy)
    cache = det_copy / "labels" / "train.yolo-engine.cache"
    assert cache.is_file() and not ds.stats["cached"] and ds.stats["images"] == 16
    assert any("Scanning" in m and "16 images" in m for m in yolo_log)

    again = _dataset(det_copy)
    assert again.stats["cached"]
    assert [lb["im_file"] for lb in again.labels] == [lb["im_file"] for lb in ds.labels]

    lb_file = det_copy / "labels" / "train" / "00003.txt"
    lb_file.write_text("1 0.5 0.5 0.2 0.2\n")
    os.utime(lb_file, ns=(1, 1))  # even an old mtime differs from the cached one
    changed = _dataset(det_copy)
    assert not changed.stats["cached"]
    i = changed.im_files.index(str(det_copy / "images" / "train" / "00003.jpg"))
    assert changed.labels[i]["cls"].tolist() == [[1.0]]
    np.testing.assert_allclose(changed.labels[i]["bboxes"], [[0.5, 0.5, 0.2, 0.2]])


def test_an_image_with_any_bad_line_is_skipped_whole(det_copy, yolo_log):
    img_dir, lb_dir = det_copy / "images" / "train", det_copy / "labels" / "train"
    (img_dir / "00000.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    (lb_dir / "00001.txt").write_text("0 0.5 0.5 0.2\n1 0.5 0.5 0.2 0.2\nx 0.1 0.1 0.1 0.1\n2 0.5 1.8 0.2 0.2\n")
    (lb_dir / "00002.txt").write_text("7 0.5 0.5 0.2 0.2\n0 0.3 0.3 0.2 0.2\n")
    (lb_dir / "00004.txt").write_text("2 0.4 0.4 0.1 0.1\n2 0.4 0.4 0.1 0.1\n0 0.6 0.6 0.1 0.1\n")
    (lb_dir / "00005.txt").unlink()  # a background image
    ds = _dataset(det_copy)
    s = ds.stats
    assert (s["images"], s["skipped"], s["duplicates"], s["backgrounds"]) == (13, 3, 1, 1)
    by_name = {os.path.basename(lb["im_file"]): lb for lb in ds.labels}
    assert not {"00000.jpg", "00001.jpg", "00002.jpg"} & set(by_name)
    assert by_name["00004.jpg"]["cls"].ravel().tolist() == [2, 0]
    assert len(by_name["00005.jpg"]["cls"]) == 0
    summary = [m for m in yolo_log if "Scanning" in m]
    assert summary and "13 images (1 backgrounds), 3 skipped, 1 duplicate rows removed" in summary[0]
    warnings = [m for m in yolo_log if "WARNING" in m]
    assert any("3 images skipped" in m for m in warnings)
    assert any("00000.jpg: skipped" in m and "decoded" in m for m in warnings)
    assert any("00001.jpg: skipped" in m and "00001.txt line 1" in m and "line 3" in m and "line 4" in m
               for m in warnings)
    assert any("00002.jpg: skipped" in m and "class 7 >= nc 3" in m for m in warnings)
    assert any("00004.jpg: kept" in m and "duplicate" in m for m in warnings)
    assert len(ds.problems) == 4


def _image_and_label(folder):
    """(a 50x40 image, the path of its label file) in `folder`."""
    im = folder / "images" / "a.jpg"
    im.parent.mkdir()
    cv2.imwrite(str(im), np.full((40, 50, 3), 90, np.uint8))
    lb = folder / "labels" / "a.txt"
    lb.parent.mkdir()
    return im, lb


def test_polygon_and_tolerance_rules(tmp_path):
    im, lb = _image_and_label(tmp_path)
    lb.write_text(
        "0 0.1 0.1 0.5 0.1 0.3 0.6\n"  # triangle
        "2 1.005 0.5 0.2 0.2\n"  # inside the tolerance: clipped
    )
    rec = labels_mod.verify_image_label(str(im), str(lb), nc=3)
    assert rec["shape"] == (40, 50) and not rec["skipped"] and rec["clipped"] == 1
    np.testing.assert_allclose(rec["bboxes"][0], [0.3, 0.35, 0.4, 0.5], atol=1e-6)
    assert rec["segments"][0].shape == (3, 2) and rec["segments"][1] is None and len(rec["cls"]) == 2
    x1, x2 = rec["bboxes"][1][0] - rec["bboxes"][1][2] / 2, rec["bboxes"][1][0] + rec["bboxes"][1][2] / 2
    assert x2 == pytest.approx(1.0) and x1 == pytest.approx(0.905)
    for line, why in [("1 0.1 0.1 0.5 0.1 0.2 0.2 0.3", "8 values"), ("1 0.1 0.1 0.5 0.1 0.3", "6 values"),
                      ("2 -0.5 0.5 0.2 0.2", "outside [0, 1]"), ("0 0.5 0.5 0 0.2", "width or height <= 0")]:
        lb.write_text("0 0.1 0.1 0.5 0.1 0.3 0.6\n" + line + "\n")
        rec = labels_mod.verify_image_label(str(im), str(lb), nc=3)
        assert why in rec["skipped"] and "line 2" in rec["skipped"] and "cls" not in rec, line


@pytest.mark.parametrize("polygon, why", [
    ("0.1 0.1 0.5 0.5 0.9 0.9", "zero-area polygon (its points lie on one line)"),
    ("0.1 0.1 0.9 0.9 0.9 0.1 0.1 0.9", "polygon of zero net area (its outline crosses itself, so the areas of its "
                                        "loops cancel)"),  # a bow-tie: two triangles going round in opposite ways
], ids=["on-one-line", "bow-tie"])
def test_a_polygon_of_zero_area_is_skipped_saying_why(tmp_path, polygon, why):
    im, lb = _image_and_label(tmp_path)
    lb.write_text(f"0 {polygon}\n")
    rec = labels_mod.verify_image_label(str(im), str(lb), nc=3)
    assert rec["skipped"] == f"{lb} line 1: {why}" and "cls" not in rec


def test_read_only_cache_location_only_warns(det_copy, monkeypatch, yolo_log):
    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(label_cache, "publish", refuse)
    ds = _dataset(det_copy)
    assert len(ds) == 16 and not (det_copy / "labels" / "train.yolo-engine.cache").exists()
    assert any("not writeable" in m for m in yolo_log)


def test_image_listing_rules(det_copy, tmp_path):
    imgs = scan_files(str(det_copy / "images" / "train"))[0]
    assert len(imgs) == 16
    assert img2label_paths(imgs)[0] == str(det_copy / "labels" / "train" / "00000.txt")
    lst = det_copy / "train.txt"
    lst.write_text("./images/train/00001.jpg\nimages/train/00002.jpg\n")
    assert [os.path.basename(f) for f in scan_files(str(lst))[0]] == ["00001.jpg", "00002.jpg"]
    assert len(scan_files(str(det_copy / "images" / "*" / "0000[0-3].jpg"))[0]) == 8
    assert len(scan_files([str(det_copy / "images" / "train"), str(det_copy / "images" / "val")])[0]) == 20
    with pytest.raises(FileNotFoundError, match="nowhere"):
        scan_files(str(tmp_path / "nowhere"))
    ds = YOLODataset(str(lst), imgsz=96, nc=3)
    assert len(ds) == 2 and (det_copy / "train.yolo-engine.cache").is_file()


def _signal_dispositions(_):
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_the_scanning_processes_do_not_keep_the_trainings_signal_handlers():
    """The label scan forks its pool after the training has set its SIGTERM and Ctrl-C handlers (engine/interrupt.py).
    Inherited, the SIGTERM one turned the pool's terminate() into an exception inside a worker's read of the task
    queue; one fresh scan in six then hung for ever. The workers die on SIGTERM and leave Ctrl-C to the parent."""
    from data.labels import _forked_pool

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for s in handlers:
            signal.signal(s, lambda *_: None)
        pool = _forked_pool(2)
        try:
            assert pool.map(_signal_dispositions, range(4)) == [(True, True)] * 4
        finally:
            pool.terminate()
            pool.join()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
