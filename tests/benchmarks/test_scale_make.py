"""benchmarks/scale.py's generated segmentation and pose sets: what `make --task` writes is what its docstring says,
and each side's dataset reads it whole."""

from pathlib import Path

import numpy as np
import pytest

from benchmarks.scale import COCO128, COCO_FLIP_IDX, make

pytestmark = pytest.mark.skipif(not (COCO128 / "labels" / "train2017").is_dir(), reason="COCO128 not present")


def _rows(path):
    return [np.array(line.split(), float) for line in Path(path).read_text().splitlines()]


def _inside(box):
    """COCO128's xywh box's part inside the image, as corners."""
    cx, cy, w, h = box
    return np.clip([cx - w / 2, cy - h / 2], 0, 1), np.clip([cx + w / 2, cy + h / 2], 0, 1)  # +-1e-5: see make


def _pairs(out):
    """(generated label rows, COCO128's rows) of every labelled image of `out`."""
    for lb in sorted((out / "labels" / "train").glob("*.txt")):
        src = COCO128 / "labels" / "train2017" / f"{lb.stem.rsplit('_', 1)[0]}.txt"
        yield _rows(lb), _rows(src)


def test_segment_outlines_lie_inside_their_boxes(tmp_path):
    out = make(130, tmp_path / "seg", "segment")
    seen = 0
    for rows, boxes in _pairs(out):
        assert len(rows) == len(boxes)
        for row, box in zip(rows, boxes):
            assert row[0] == box[0]
            xy = row[1:].reshape(-1, 2)
            assert 12 <= len(xy) <= 80
            lo, hi = _inside(box[1:5])
            assert np.all(xy >= lo - 1e-5) and np.all(xy <= hi + 1e-5)
            seen += 1
    assert seen > 900
    # copies of one photo share its label file (hard links): N images cost no disk
    a, b = out / "labels" / "train" / "000000000009_00000.txt", out / "labels" / "train" / "000000000009_00001.txt"
    assert a.stat().st_ino == b.stat().st_ino


def test_pose_keypoints_a_third_unlabelled_and_the_yaml_valid(tmp_path):
    from data.dataset_yaml import check_pose_dataset

    out = make(128, tmp_path / "pose", "pose")
    visible = set()
    for rows, boxes in _pairs(out):
        for row, box in zip(rows, boxes):
            assert len(row) == 5 + 17 * 3
            lo, hi = _inside(box[1:5])
            np.testing.assert_allclose(row[:5], np.r_[box[0], (lo + hi) / 2, hi - lo], atol=3e-5)
            k = row[5:].reshape(17, 3)
            assert np.all((k[k[:, 2] > 0, :2] >= lo - 1e-5) & (k[k[:, 2] > 0, :2] <= hi + 1e-5))
            off = k[:, 2] == 0
            assert off.sum() == 6 and np.all(k[off] == 0)
            visible |= set(k[~off, 2])
    assert visible == {1, 2}  # labelled keypoints both hidden (1) and visible (2)
    d = check_pose_dataset(str(out / "data.yaml"))
    assert d["kpt_shape"] == [17, 3] and d["flip_idx"] == COCO_FLIP_IDX
    # COCO's flip: the nose stays, every other keypoint swaps with its neighbour (left, right pairs)
    assert [COCO_FLIP_IDX[i] for i in COCO_FLIP_IDX] == list(range(17))
    assert [i for i in range(17) if COCO_FLIP_IDX[i] == i] == [0]


@pytest.mark.parametrize("task", ["segment", "pose"])
def test_our_dataset_reads_every_generated_label(tmp_path, task):
    from benchmarks.scale import _ours

    out = make(128, tmp_path / task, task)
    ds, _ = _ours(out, 320, task)
    assert ds.problems == [] and ds.stats["skipped"] == ds.stats["clipped"] == 0
    rows = [r for rows, _ in _pairs(out) for r in rows]
    assert sum(len(lb["cls"]) for lb in ds.labels) == len(rows)
    if task == "segment":  # every outline read whole, point for point
        assert sum(len(s) for lb in ds.labels for s in lb["segments"]) == sum((len(r) - 1) // 2 for r in rows)
    else:
        assert sum(int((lb["keypoints"][..., 2] > 0).sum()) for lb in ds.labels) == 11 * len(rows)
