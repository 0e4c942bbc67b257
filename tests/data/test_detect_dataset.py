import os

import cv2
import numpy as np
import pytest
import torch

from data.detect_dataset import YOLODataset
from data.image_files import disk_cache_path
from data.label_formats import SegmentLabels
from data.loader import rank_indices
from utils.errors import BadDataset

STRONG = {"degrees": 15.0, "shear": 5.0, "perspective": 0.0005, "translate": 0.1, "scale": 0.5, "mixup": 0.5,
          "flipud": 0.5, "fliplr": 0.5, "mosaic": 1.0}


def _labels_px(path, w, h):
    rows = [np.array(r.split(), float) for r in open(path).read().splitlines()]
    return rows, [(r[1:].reshape(-1, 2) * [w, h]) for r in rows]


def test_collate_detect_batch(shapes_det):
    ds = YOLODataset(str(shapes_det / "images" / "train"), imgsz=128, augment=True, nc=3, hyp=STRONG)
    batch = ds.collate_fn([ds[i] for i in range(4)])
    assert batch["img"].shape == (4, 3, 128, 128) and batch["img"].dtype == torch.uint8
    t = batch["targets"]
    assert (t.boxes.format, t.boxes.canvas, t.boxes.normalized) == ("cxcywh", (128, 128), True)
    assert t.boxes.data.dtype == torch.float32 and t.boxes.data.shape == (len(t), 4) and len(t) > 0
    assert set(t.image.tolist()) <= {0, 1, 2, 3} and t.cls.max() < 3 and t.keypoints is None
    assert len(batch["paths"]) == 4 and batch["shapes"] == (None,) * 4
    assert "masks" not in batch


def test_val_letterbox_maps_back_to_the_labels(shapes_det):
    """Targets + shapes of a rect val batch must map back onto the label files' boxes in original pixels."""
    ds = YOLODataset(str(shapes_det / "images" / "val"), imgsz=96, batch_size=4, rect=True, pad=0.5, stride=32, nc=3)
    batch = ds.collate_fn([ds[i] for i in range(len(ds))])
    H, W = batch["img"].shape[2:]
    assert H % 32 == 0 and W % 32 == 0
    for i, (path, ((h0, w0), ((rh, rw), (pw, ph)))) in enumerate(zip(batch["paths"], batch["shapes"])):
        t = batch["targets"].of_image(i).boxes.data
        x1 = ((t[:, 0] - t[:, 2] / 2) * W - pw) / rw
        y1 = ((t[:, 1] - t[:, 3] / 2) * H - ph) / rh
        rows, _ = _labels_px(path.replace("images", "labels").replace(".jpg", ".txt"), w0, h0)
        ref = np.array([[(r[1] - r[3] / 2) * w0, (r[2] - r[4] / 2) * h0] for r in rows])
        assert cv2.imread(path).shape[:2] == (h0, w0)
        np.testing.assert_allclose(torch.stack([x1, y1], 1).numpy(), ref, atol=0.6)


def test_mosaic_perspective_boxes_inside_and_match_masks(shapes_seg):
    ds = YOLODataset(str(shapes_seg / "images" / "train"), imgsz=128, augment=True,
                     task=SegmentLabels(overlap=False), nc=3, hyp={**STRONG, "copy_paste": 0.5}, seed=5)
    checked = 0
    for i in range(len(ds)):
        s = ds[i]
        b = s["boxes"].data.numpy()
        xyxy = np.concatenate([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)
        assert (xyxy >= -1e-6).all() and (xyxy <= 1 + 1e-6).all()
        assert s["masks"].shape == (len(b), 32, 32)
        for box, m in zip(xyxy * 32, s["masks"].numpy()):  # mask-pixel units
            ys, xs = np.nonzero(m)
            if len(xs) < 4:
                continue
            mb = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            assert (mb[:2] >= box[:2] - 1).all() and (mb[2:] <= box[2:] + 1).all(), (mb, box)  # mask inside box
            inter = np.prod(np.clip(np.minimum(mb[2:], box[2:]) - np.maximum(mb[:2], box[:2]), 0, None))
            union = np.prod(mb[2:] - mb[:2]) + np.prod(box[2:] - box[:2]) - inter
            if (box[2:] - box[:2]).min() >= 6:  # quantisation dominates smaller ones
                assert inter / union > 0.6, (mb, box)  # thin tips under half a mask pixel may vanish from the mask
                checked += 1
    assert checked > 20


def test_overlap_mask_indices_follow_targets(shapes_seg):
    kw = dict(imgsz=128, augment=True, nc=3, hyp=STRONG, seed=9)
    over = YOLODataset(str(shapes_seg / "images" / "train"), task=SegmentLabels(overlap=True), **kw)
    sep = YOLODataset(str(shapes_seg / "images" / "train"), task=SegmentLabels(overlap=False), **kw)
    for i in range(6):  # same seed and process: both draw identical augmentations
        a, b = over[i], sep[i]
        assert torch.equal(a["img"], b["img"]) and len(a["cls"]) == len(b["cls"])
        m = a["masks"].numpy()
        assert m.shape == (32, 32) and m.max() <= len(a["cls"])
        rows_b = [tuple(np.round(r, 5)) for r in torch.cat([b["cls"][:, None], b["boxes"].data], 1).tolist()]
        rows_a = torch.cat([a["cls"][:, None], a["boxes"].data], 1).tolist()
        order = [rows_b.index(tuple(np.round(r, 5))) for r in rows_a]
        areas = [b["masks"][j].sum().item() for j in order]
        assert areas == sorted(areas, reverse=True)  # largest first, so the smallest ends up on top
        for k, j in enumerate(order):
            own = b["masks"][j].numpy() > 0
            on_top = np.zeros_like(own)
            for j2 in order[k + 1 :]:
                on_top |= b["masks"][j2].numpy() > 0
            np.testing.assert_array_equal(m == k + 1, own & ~on_top)


def test_segment_collate_and_masks_on_polygons(shapes_seg):
    ds = YOLODataset(str(shapes_seg / "images" / "val"), imgsz=128, task="segment", nc=3, batch_size=4)
    batch = ds.collate_fn([ds[i] for i in range(4)])
    assert batch["masks"].shape == (4, 32, 32) and batch["masks"].dtype == torch.uint8
    assert (batch["overlap"], batch["mask_ratio"]) == (True, 4)  # how the masks read travels with them
    for i, (path, ((h0, w0), ((rh, rw), (pw, ph)))) in enumerate(zip(batch["paths"], batch["shapes"])):
        n = len(batch["targets"].of_image(i))
        rows, polys = _labels_px(path.replace("images", "labels").replace(".jpg", ".txt"), w0, h0)
        assert n == len(rows) and batch["masks"][i].max() <= n
        union = np.zeros((128, 128), np.uint8)  # independent: polygons drawn at full size, then shrunk
        for p in polys:
            cv2.fillPoly(union, [np.round(p * [rw, rh] + [pw, ph]).astype(np.int32)], 1)
        small = cv2.resize(union.astype(np.float32), (32, 32), interpolation=cv2.INTER_AREA) >= 0.5
        got = batch["masks"][i].numpy() > 0
        assert (got & small).sum() / max((got | small).sum(), 1) > 0.9
    sep = YOLODataset(str(shapes_seg / "images" / "val"), imgsz=128, task=SegmentLabels(overlap=False), nc=3)
    b2 = sep.collate_fn([sep[i] for i in range(4)])
    assert b2["masks"].shape == (len(b2["targets"]), 32, 32) and b2["masks"].dtype == torch.float32
    assert b2["overlap"] is False


def test_ram_cache_only_holds_cache_indices(shapes_det):
    path = str(shapes_det / "images" / "train")
    ds = YOLODataset(path, imgsz=96, cache="ram", cache_indices=[1, 4, 7], nc=3)
    assert [i for i, im in enumerate(ds.ims) if im is not None] == [1, 4, 7]
    assert ds[4]["img"].shape[0] == 3 and ds[0]["img"].shape[0] == 3  # uncached images still load from disk
    held = []
    for rank in range(3):
        r = YOLODataset(path, imgsz=96, cache="ram", rank=rank, world_size=3, seed=11, nc=3)
        held.append({i for i, im in enumerate(r.ims) if im is not None})
        assert held[-1] == set(rank_indices(16, 3, rank, 11).tolist())
    assert set.union(*held) == set(range(16)) and sum(map(len, held)) == 16


def test_disk_cache_writes_npy(det_copy):
    ds = YOLODataset(str(det_copy / "images" / "val"), imgsz=96, cache="disk", nc=3)
    npys = sorted((det_copy / "images" / "val").glob("*.npy"))
    assert npys == [disk_cache_path(f) for f in sorted(ds.im_files)]
    np.testing.assert_array_equal(np.load(npys[0]), cv2.imread(ds.im_files[0]))
    assert ds[0]["img"].shape == (3, 96, 96)


def test_disk_cache_on_a_read_only_dataset_warns_once_and_reads_the_images(det_copy, monkeypatch, yolo_log):
    """--cache disk where the filesystem refuses some copies (a read-only dataset: issue 61) is no traceback: the
    copies that can be written are, the others' images are read from their files, one warning says how many."""
    import errno

    import data.image_cache as image_cache

    val = det_copy / "images" / "val"
    refused = set(sorted(str(f) for f in val.glob("*.jpg"))[::2])
    write = image_cache.write_disk_cache

    def read_only(npy, im):
        if any(str(npy).startswith(str(disk_cache_path(f))) for f in refused):
            raise OSError(errno.EROFS, "Read-only file system", str(npy))
        write(npy, im)

    monkeypatch.setattr(image_cache, "write_disk_cache", read_only)
    ds = YOLODataset(str(val), imgsz=96, cache="disk", nc=3)
    warned = [m for m in yolo_log if "--cache disk:" in m]
    assert len(warned) == 1 and f"{len(refused)} of {len(ds.im_files)} copies could not be written" in warned[0]
    assert "Read-only file system" in warned[0] and str(val) in warned[0]
    for f in ds.im_files:
        assert disk_cache_path(f).exists() == (f not in refused)
        np.testing.assert_array_equal(ds._read(ds.im_files.index(f)), cv2.imread(f))


def test_npy_files_are_not_read_without_disk_cache(det_copy):
    """A user's own x.npy (a depth map) or a cache left by an earlier --cache disk run is never the image."""
    val = det_copy / "images" / "val"
    im_file = sorted(val.glob("*.jpg"))[0]
    np.save(im_file.with_suffix(".npy"), np.zeros((10, 10, 3), np.uint8))
    np.save(disk_cache_path(im_file), np.zeros((12, 12, 3), np.uint8))
    ds = YOLODataset(str(val), imgsz=96, nc=3)
    assert ds.load_image(ds.im_files.index(str(im_file)))[1] == cv2.imread(str(im_file)).shape[:2]


def test_disk_cache_keeps_images_of_one_stem_apart(det_copy):
    """a.jpg and a.png: each has a copy of its own, not one shared a.npy (in one folder they would share a label
    file too, which is refused: tests/test_bounded_cost.py)."""
    val = det_copy / "images" / "val"
    jpgs = sorted(val.glob("*.jpg"))
    png = det_copy / "images" / "other" / jpgs[0].with_suffix(".png").name
    png.parent.mkdir()
    cv2.imwrite(str(png), cv2.imread(str(jpgs[1]))[:50, :70])  # another picture, another size
    assert disk_cache_path(jpgs[0]).name != disk_cache_path(png).name
    ds = YOLODataset([str(val), str(png.parent)], imgsz=96, cache="disk", nc=3)
    for f in (jpgs[0], png):
        np.testing.assert_array_equal(ds._read(ds.im_files.index(str(f))), cv2.imread(str(f)))


def _bad_disk_caches(val):
    """Spoil the --cache disk copies of four images four ways; returns those images."""
    jpgs = sorted(val.glob("*.jpg"))
    edited = cv2.imread(str(jpgs[0]))[:60, :80]
    cv2.imwrite(str(jpgs[0]), edited)  # edited after the cache was written: the cache is older
    st = os.stat(disk_cache_path(jpgs[0]))
    os.utime(jpgs[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    disk_cache_path(jpgs[1]).write_text("garbage\n")
    np.save(disk_cache_path(jpgs[2]), np.array([{"a": 1}], dtype=object), allow_pickle=True)  # a pickle: never loaded
    np.save(disk_cache_path(jpgs[3]), cv2.imread(str(jpgs[3])).astype(np.float32))  # wrong dtype
    return jpgs


def test_stale_or_broken_disk_cache_is_rebuilt_from_the_image(det_copy):
    val = det_copy / "images" / "val"
    YOLODataset(str(val), imgsz=96, cache="disk", nc=3)
    jpgs = _bad_disk_caches(val)
    ds = YOLODataset(str(val), imgsz=96, cache="disk", nc=3)
    for f in jpgs:
        np.testing.assert_array_equal(np.load(disk_cache_path(f)), cv2.imread(str(f)))
    assert not list(val.glob(".*")), "temporary files left beside the images"
    disk_cache_path(jpgs[1]).write_bytes(b"\x93NUMPY cut short")  # broken during the run: the image is read instead
    assert ds.load_image(ds.im_files.index(str(jpgs[1])))[1] == cv2.imread(str(jpgs[1])).shape[:2]


def test_hyp_untouched_close_mosaic_and_determinism(shapes_det):
    hyp = dict(STRONG)
    ds = YOLODataset(str(shapes_det / "images" / "train"), imgsz=96, augment=True, hyp=hyp, nc=3, seed=3)
    twin = YOLODataset(str(shapes_det / "images" / "train"), imgsz=96, augment=True, hyp=hyp, nc=3, seed=3)
    for i in range(3):
        a, b = ds[i], twin[i]
        assert a["shape"] is None and torch.equal(a["img"], b["img"]) and torch.equal(a["boxes"].data, b["boxes"].data)
    assert hyp == STRONG
    ds.close_mosaic()
    s = ds[0]
    assert s["shape"] is not None and s["img"].shape == (3, 96, 96)


def test_rect_batches_share_a_shape(shapes_det):
    ds = YOLODataset(str(shapes_det / "images" / "train"), imgsz=128, batch_size=4, rect=True, stride=32, nc=3)
    ars = [lb["shape"][0] / lb["shape"][1] for lb in ds.labels]
    assert ars == sorted(ars)
    for start in range(0, 16, 4):
        batch = ds.collate_fn([ds[i] for i in range(start, start + 4)])
        h, w = batch["img"].shape[2:]
        assert h % 32 == 0 and w % 32 == 0 and max(h, w) == 128


def test_bad_arguments(shapes_det, tmp_path):
    with pytest.raises(ValueError, match="task"):
        YOLODataset(str(shapes_det / "images" / "val"), task="pose")
    with pytest.raises(BadDataset, match="val: .*missing"):
        YOLODataset(str(tmp_path / "missing"), prefix="val: ")


@pytest.mark.parametrize("task", ["detect", "segment"])
def test_device_hsv_leaves_the_same_gains_to_the_device(shapes_det, shapes_seg, task):
    """With device_hsv the batch carries each sample's gains and pixels without them; the trainer's step on the device
    gives the loader's own pixels (but for OpenCV's own rounding: at most one grey level), the rest is equal."""
    from types import SimpleNamespace

    from engine.trainer import BaseTrainer

    root = shapes_det if task == "detect" else shapes_seg
    here, there = (YOLODataset(str(root / "images" / "train"), imgsz=96, augment=True, hyp=STRONG, nc=3, seed=5,
                               task=task, device_hsv=dev) for dev in (False, True))
    idx = list(range(8))
    a, b = here.collate_fn(here.__getitems__(idx)), there.collate_fn(there.__getitems__(idx))
    assert "hsv" not in a and b["hsv"].shape == (8, 3, 256) and b["hsv"].dtype == torch.uint8
    assert not torch.equal(a["img"], b["img"])
    ta, tb = a["targets"], b["targets"]  # the geometry and the draws after the colour are the same
    assert torch.equal(ta.boxes.data, tb.boxes.data) and torch.equal(ta.image, tb.image)
    assert "masks" not in a or torch.equal(a["masks"], b["masks"])
    BaseTrainer.preprocess_batch(SimpleNamespace(device=torch.device("cpu")), b)
    diff = (b["img"] * 255 - a["img"].float()).abs()
    # OpenCV rounds the last pixels of each row (its scalar path) where its vector path truncates, as the device does
    assert diff.max() <= 1 + 1e-4 and (diff < 1e-4).float().mean() > 0.85
    plain = dict(STRONG, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    none = YOLODataset(str(root / "images" / "train"), imgsz=96, augment=True, hyp=plain, nc=3, task=task,
                       device_hsv=True)
    assert "hsv" not in none.collate_fn(none.__getitems__(idx))


def test_label_files_beside_their_images_are_not_stray_entries(tmp_path):
    """CVAT's YOLO 1.1 export keeps each label beside its image (obj_train_data/x.jpg, x.txt: no /images/ folder, so
    the label path is the image's with .txt): read as the labels, not listed as ignored entries; a text file that
    labels no image still is."""
    folder = tmp_path / "obj_train_data"
    folder.mkdir()
    for name in ("a", "b"):
        cv2.imwrite(str(folder / f"{name}.jpg"), np.zeros((48, 64, 3), np.uint8))
        (folder / f"{name}.txt").write_text("0 0.5 0.5 0.25 0.5\n")
    (folder / "notes.txt").write_text("not a label\n")
    ds = YOLODataset(str(folder), imgsz=64, nc=1)
    assert ds.stats["images"] == 2 and ds.stats["backgrounds"] == 0
    assert ds.stats["ignored"] == 1 and ds.problems == [f"{folder / 'notes.txt'}: ignored, suffix '.txt' is not an "
                                                         "image format"]
