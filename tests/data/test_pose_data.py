"""Pose data: the keypoint label format, keypoints through flips (flip_idx), random affine and mosaic, bad keypoint
lines under the bad-input policy, and the pose dataset YAML checks."""

import types

import cv2
import numpy as np
import pytest
import yaml

from data.augment import Instances, random_perspective
from data.dataset_yaml import DatasetError, check_pose_dataset
from data.detect_dataset import YOLODataset
from data.label_formats import BadLine, PoseLabels
from data.synthetic import POSE_FLIP_IDX, generate_dataset


@pytest.fixture(scope="module")
def pose_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("pose")
    generate_dataset(root, task="pose", n_train=12, n_val=4, seed=0, min_side=96, max_side=160)
    return root


def _instances(kpts, boxes):
    return Instances(np.zeros(len(boxes), np.float32), np.array(boxes, np.float32), None,
                     np.array(kpts, np.float32))


# ------------------------------------------------------------------------------------------ the label format
def test_parse_reads_box_and_keypoints():
    fmt = PoseLabels((3, 3))
    box, kpts, clipped = fmt.parse(np.array([0.5, 0.5, 0.4, 0.2, 0.3, 0.4, 2, 0.7, 0.6, 1, 9, 9, 0], float))
    np.testing.assert_allclose(box, [0.5, 0.5, 0.4, 0.2])
    # an unlabelled keypoint's coordinates are not read (here 9 9: outside the image, and not an error)
    np.testing.assert_allclose(kpts, [[0.3, 0.4, 2], [0.7, 0.6, 1], [0, 0, 0]])
    assert not clipped
    box, kpts, _ = PoseLabels((2, 2)).parse(np.array([0.5, 0.5, 0.4, 0.2, 0.3, 0.4, 0.7, 0.6], float))
    np.testing.assert_allclose(kpts[:, 2], [2, 2])  # x y keypoints are all labelled


@pytest.mark.parametrize("values,why", [
    ([0.5, 0.5, 0.4, 0.2, 0.3, 0.4, 2], "8 values, expected 14"),
    ([0.5, 0.5, 0.4, 0.2, 0.3, 0.4, 2, 0.7, 0.6, 3, 0.1, 0.1, 2], "visibility must be 0, 1 or 2"),
    ([0.5, 0.5, 0.4, 0.2, 0.3, 1.4, 2, 0.7, 0.6, 2, 0.1, 0.1, 2], "keypoint coordinates outside"),
    ([0.5, 0.5, 0.0, 0.2, 0.3, 0.4, 2, 0.7, 0.6, 2, 0.1, 0.1, 2], "box width or height"),
])
def test_parse_refuses_bad_keypoint_lines(values, why):
    with pytest.raises(BadLine, match=why):
        PoseLabels((3, 3)).parse(np.array(values, float))


def test_bad_keypoint_lines_skip_their_image_named_and_counted(pose_set, tmp_path):
    """The bad-input policy: an image whose label file has a bad keypoint line is skipped whole, its file and line
    named in `problems` (what data_problems.txt lists), and counted."""
    import shutil

    root = tmp_path / "set"
    shutil.copytree(pose_set, root)
    bad = sorted((root / "labels" / "train").glob("*.txt"))[:2]
    bad[0].write_text(bad[0].read_text() + "0 0.5 0.5 0.2 0.2 0.1 0.1 2\n")  # 2 keypoints short
    bad[1].write_text("0 0.5 0.5 0.2 0.2" + " 0.5 0.5 7" * 4 + "\n")  # visibility 7
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, task=PoseLabels((4, 3), POSE_FLIP_IDX))
    assert ds.stats["skipped"] == 2 and len(ds) == 10
    assert any(bad[0].name in p and "expected 17" in p for p in ds.problems), ds.problems
    assert any(bad[1].name in p and "visibility" in p for p in ds.problems), ds.problems


# ------------------------------------------------------------------------------------------ augmentation
def test_flip_swaps_left_and_right_keypoints():
    """A left-right mirror moves every keypoint and renames it by flip_idx: the top-left corner of a rectangle lands
    where the top-right one was, and is then called top-right."""
    box = [[10, 20, 50, 40]]
    kpts = [[[10, 20, 2], [50, 20, 2], [50, 40, 0], [10, 40, 2]]]  # top-left, top-right, bottom-right, bottom-left
    inst = _instances(kpts, box)
    inst.flip(width=100, flip_idx=POSE_FLIP_IDX)
    np.testing.assert_allclose(inst.boxes, [[50, 20, 90, 40]])
    np.testing.assert_allclose(inst.keypoints[0], [[50, 20, 2], [90, 20, 2], [90, 40, 2], [50, 40, 0]])
    up = _instances(kpts, box)
    up.flip(height=60, flip_idx=POSE_FLIP_IDX)  # up-down: positions mirror, names stay
    np.testing.assert_allclose(up.keypoints[0, :, 1], [40, 40, 20, 20])
    np.testing.assert_allclose(up.keypoints[0, :, 2], [2, 2, 0, 2])


@pytest.mark.parametrize("seed", range(4))
def test_random_affine_moves_keypoints_with_the_pixels(seed):
    """Three coloured dots warped with the image: each visible keypoint is found where its dot went; those pushed
    outside the image are marked not visible (seed 2 pushes one out)."""
    img = np.zeros((128, 160, 3), np.uint8)
    pts = np.array([[40, 30], [120, 50], [80, 100]], np.float32)
    for (x, y), c in zip(pts, ((255, 0, 0), (0, 255, 0), (0, 0, 255))):
        cv2.circle(img, (int(x), int(y)), 3, c, -1)
    inst = _instances([np.concatenate([pts, np.full((3, 1), 2)], 1)], [[30, 20, 130, 110]])
    out, warped = random_perspective(img, inst, degrees=30, translate=0.3, scale=0.4, shear=5,
                                     rng=np.random.default_rng(seed))
    assert len(warped) == 1
    for k, channel in enumerate((0, 1, 2)):
        x, y, v = warped.keypoints[0, k]
        others = np.delete(out, channel, axis=2)
        ys, xs = np.nonzero((out[..., channel] > 150) & (others.max(2) < 60))  # the dot, not the grey fill
        if v:
            assert len(xs) and abs(xs.mean() - x) < 2 and abs(ys.mean() - y) < 2
        else:  # pushed out: clipped onto the border, and its dot's centre is not in the image
            assert x in (0, 160) or y in (0, 128)
            assert not len(xs) or not (1 < xs.mean() < 159 and 1 < ys.mean() < 127)


def test_keypoints_pushed_outside_are_not_visible():
    img = np.zeros((100, 100, 3), np.uint8)
    inst = _instances([[[20, 20, 2], [80, 80, 2], [95, 50, 1]]], [[10, 10, 98, 90]])
    # a translation right by 30 % of the width: the right-hand keypoints leave the image, the left one stays
    out, warped = random_perspective(img, inst, translate=0.0, scale=0.0, border=(0, 0),
                                     rng=np.random.default_rng(0))
    shifted = _instances([[[20, 20, 2], [80, 80, 2], [95, 50, 1]]], [[10, 10, 98, 90]])
    shifted.boxes += [30, 0, 30, 0]
    shifted.keypoints[..., 0] += 30
    shifted.clip(100, 100)
    np.testing.assert_allclose(shifted.keypoints[0, :, 2], [2, 0, 0])
    np.testing.assert_allclose(shifted.keypoints[0, :, 0], [50, 100, 100])  # clipped, and no longer visible
    np.testing.assert_allclose(warped.keypoints, inst.keypoints)  # no warp: nothing changes


def test_mosaic_and_affine_keep_keypoints_on_their_boxes(pose_set):
    """Mosaic + random affine + flips on rectangles whose keypoints are their corners: every visible keypoint lies in
    the image and on its own box (the box is warped with the same matrix), in the sample's normalised coordinates."""
    hyp = {"degrees": 10.0, "translate": 0.1, "scale": 0.5, "shear": 2.0, "mosaic": 1.0, "fliplr": 0.5, "flipud": 0.5}
    ds = YOLODataset(str(pose_set / "images" / "train"), imgsz=96, augment=True, hyp=hyp,
                     task=PoseLabels((4, 3), POSE_FLIP_IDX))
    seen = hidden = 0
    for i in range(len(ds)):
        s = ds[i]
        kpts, boxes = s["keypoints"].numpy(), s["boxes"].data.numpy()
        assert kpts.shape == (len(boxes), 4, 3)
        x1, y1 = boxes[:, :1] - boxes[:, 2:3] / 2, boxes[:, 1:2] - boxes[:, 3:4] / 2
        x2, y2 = boxes[:, :1] + boxes[:, 2:3] / 2, boxes[:, 1:2] + boxes[:, 3:4] / 2
        vis = kpts[..., 2] > 0
        tol = 2 / 96
        on_box = (kpts[..., 0] >= x1 - tol) & (kpts[..., 0] <= x2 + tol) & (kpts[..., 1] >= y1 - tol) & \
                 (kpts[..., 1] <= y2 + tol)
        assert on_box[vis].all()
        assert ((kpts[..., :2] >= 0) & (kpts[..., :2] <= 1)).all()
        seen += vis.sum()
        hidden += (~vis).sum()
    assert seen > 50 and hidden > 0  # the mosaic crops pushed some corners out


def test_collate_keeps_keypoints_in_target_order(pose_set):
    ds = YOLODataset(str(pose_set / "images" / "val"), imgsz=64, task=PoseLabels((4, 3), POSE_FLIP_IDX))
    batch = ds.collate_fn([ds[0], ds[1]])
    kpts = batch["targets"].keypoints
    assert kpts.shape == (len(batch["targets"]), 4, 3) and "keypoints" not in batch
    n0 = len(ds[0]["cls"])
    np.testing.assert_allclose(kpts[:n0].numpy(), ds[0]["keypoints"].numpy())


# ------------------------------------------------------------------------------------------ the dataset YAML
def _yaml(tmp_path, pose_set, **keys):
    d = {"path": str(pose_set), "train": "images/train", "val": "images/val", "names": {0: "rectangle"}, **keys}
    f = tmp_path / "pose.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def test_pose_dataset_yaml_gives_kpt_shape_flip_idx_skeleton(tmp_path, pose_set):
    d = check_pose_dataset(_yaml(tmp_path, pose_set, kpt_shape=[4, 3], flip_idx=[1, 0, 3, 2], skeleton=[[0, 1]]))
    assert d["kpt_shape"] == [4, 3] and d["flip_idx"] == [1, 0, 3, 2] and d["skeleton"] == [[0, 1]]


@pytest.mark.parametrize("keys,why", [
    ({}, "'kpt_shape' must be"),
    ({"kpt_shape": [4]}, "'kpt_shape' must be"),
    ({"kpt_shape": [4, 5]}, "'kpt_shape' must be"),
    ({"kpt_shape": ["4", 3]}, "'kpt_shape' must be"),
    ({"kpt_shape": [4, 3], "flip_idx": [1, 0, 3]}, "'flip_idx' must list each keypoint index 0..3"),
    ({"kpt_shape": [4, 3], "flip_idx": [1, 1, 3, 2]}, "'flip_idx' must list"),
    ({"kpt_shape": [4, 3], "skeleton": [[0, 4]]}, "'skeleton' must be"),
])
def test_pose_dataset_yaml_mistakes_name_the_key(tmp_path, pose_set, keys, why):
    with pytest.raises(DatasetError, match=why):
        check_pose_dataset(_yaml(tmp_path, pose_set, **keys))


def test_bad_kpt_shape_is_one_error_line_and_exit_2(tmp_path, pose_set):
    import subprocess
    import sys

    from utils.files import ROOT

    data = _yaml(tmp_path, pose_set, kpt_shape=[4, 3], flip_idx=[0, 1])
    r = subprocess.run([sys.executable, "pose/train.py", "--data", str(data), "--epochs", "1", "--device", "cpu",
                        "--project", str(tmp_path / "runs")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "flip_idx" in lines[-1] and "Traceback" not in r.stderr


def test_the_keypoint_keys_are_checked_before_the_data_is_generated(tmp_path):
    """A pose YAML given to a detection script, or a pose YAML with a mistake, is refused before its synthetic set is
    generated (minutes for a large one)."""
    from engine.tasks.boxes import box_data
    from utils.errors import BadDataset

    spec = {"path": str(tmp_path / "gen"), "train": "images/train", "val": "images/val", "names": ["a"],
            "synthetic": {"task": "pose", "n_train": 4, "n_val": 2}}
    pose, bad = tmp_path / "pose.yaml", tmp_path / "bad.yaml"
    pose.write_text(yaml.safe_dump({**spec, "kpt_shape": [5, 3], "flip_idx": [0, 2, 1, 4, 3]}))
    bad.write_text(yaml.safe_dump({**spec, "kpt_shape": [5, 4]}))
    with pytest.raises(BadDataset, match="a pose dataset .it has kpt_shape.; use pose/train.py"):
        box_data(str(pose), types.SimpleNamespace(single_cls=False), "train")
    with pytest.raises(DatasetError, match="'kpt_shape' must be"):
        check_pose_dataset(str(bad))
    assert not (tmp_path / "gen").exists()
    assert check_pose_dataset(str(pose))["kpt_shape"] == [5, 3] and (tmp_path / "gen").is_dir()
