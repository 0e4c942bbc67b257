import shutil

import cv2
import numpy as np
import torch

from data.classify_dataset import (
    ClassificationDataset,
    ClassifyTrainTransforms,
    classify_val_transforms,
)
from data.image_files import disk_cache_path
from data.loader import build_dataloader


def test_shapes_dtypes_and_collate(shapes_cls):
    ds = ClassificationDataset(shapes_cls / "train", imgsz=32, augment=True, hyp={"scale": 0.5, "fliplr": 0.5})
    assert len(ds) == 12 and ds.names == {0: "circle", 1: "rectangle", 2: "triangle"}
    s = ds[5]
    assert s["img"].shape == (3, 32, 32) and s["img"].dtype == torch.float32
    assert 0 <= s["img"].min() and s["img"].max() <= 1 and s["cls"] == 1
    batch = next(iter(build_dataloader(ds, 6, workers=0, shuffle=True)))
    assert batch["img"].shape == (6, 3, 32, 32) and batch["cls"].dtype == torch.int64 and batch["cls"].shape == (6,)


def test_val_transform_resizes_short_side_then_centre_crops():
    im = np.zeros((40, 80, 3), np.uint8)
    im[:, 30:50] = 255  # a white band in the middle of the wide image
    t = classify_val_transforms(20)(im)
    assert t.shape == (3, 20, 20)
    # short side 40 -> 20, so the image becomes 20 x 40 and the centre crop keeps columns 10..30 of it
    row = t[0, 10]
    assert (row[6:14] > 0.95).all() and (row[:4] < 0.05).all() and (row[16:] < 0.05).all()
    tall = classify_val_transforms(16)(np.zeros((50, 30, 3), np.uint8))
    assert tall.shape == (3, 16, 16) and tall.dtype == torch.float32


def test_train_crop_boxes_respect_scale_and_aspect():
    tf = ClassifyTrainTransforms(24, {"scale": 0.5, "fliplr": 0.5, "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4})
    rng = np.random.default_rng(0)
    for _ in range(200):
        top, left, h, w = tf.crop_box(60, 90, rng)
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 90
        assert 0.5 * 5400 * 0.9 <= h * w <= 5400 and 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1
    im = np.zeros((40, 40, 3), np.uint8)
    im[..., 2] = 200  # red in BGR
    out = tf(im, rng)
    assert out.shape == (3, 24, 24) and out[0].mean() > out[2].mean()  # RGB order out


def test_corrupt_image_skipped_counted_and_cache_reused(shapes_cls, tmp_path, yolo_log):
    root = tmp_path / "cls"
    shutil.copytree(shapes_cls, root)
    bad = root / "train" / "circle" / "00001.jpg"
    bad.write_bytes(b"not an image at all")
    ds = ClassificationDataset(root / "train", imgsz=32)
    assert len(ds) == 11 and ds.stats == {"images": 11, "skipped": 1, "empty_classes": 0, "absent_classes": 0,
                                          "cached": False, "ignored": 0}
    assert str(bad) not in [f for f, _ in ds.samples]
    assert any("11 images, 1 skipped" in m for m in yolo_log)
    assert any(str(bad) in m and "WARNING" in m for m in yolo_log)
    assert (root / "train.yolo-engine.cache").is_file()
    again = ClassificationDataset(root / "train", imgsz=32)
    assert again.stats["cached"] and again.samples == ds.samples


def test_ram_cache_indices(shapes_cls):
    ds = ClassificationDataset(shapes_cls / "val", imgsz=32, cache="ram", cache_indices=[0, 3])
    assert [i for i, im in enumerate(ds.ims) if im is not None] == [0, 3]
    np.testing.assert_array_equal(ds.ims[3], cv2.imread(ds.samples[3][0]))
    assert ds[3]["img"].shape == ds[1]["img"].shape == (3, 32, 32)


def test_disk_cache_read_only_when_asked_and_rebuilt_when_broken(shapes_cls, tmp_path):
    root = tmp_path / "cls"
    shutil.copytree(shapes_cls, root)
    im_file = root / "val" / "circle" / "00000.jpg"
    np.save(im_file.with_suffix(".npy"), np.zeros((10, 10, 3), np.uint8))  # a user's own array, not the image
    plain = ClassificationDataset(root / "val", imgsz=32)
    i = [f for f, _ in plain.samples].index(str(im_file))
    np.testing.assert_array_equal(plain._read(i), cv2.imread(str(im_file)))
    disk_cache_path(im_file).write_text("garbage\n")
    cached = ClassificationDataset(root / "val", imgsz=32, cache="disk")
    np.testing.assert_array_equal(np.load(disk_cache_path(im_file)), cv2.imread(str(im_file)))
    assert cached[i]["img"].shape == (3, 32, 32)
