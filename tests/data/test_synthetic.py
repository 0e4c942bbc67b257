import cv2
import numpy as np
import pytest

from data import synthetic
from data.synthetic import CLASS_NAMES, generate_dataset, render_sample

DIFF = 40  # JPEG error and background noise stay well below this; shape colours contrast by >= 130


def _read_labels(path):
    return [np.array(line.split(), dtype=np.float64) for line in path.read_text().splitlines()]


def _changed(img, bg):
    return np.abs(img.astype(int) - bg.astype(int)).max(2) > DIFF


def _raster(points_px, shape):
    m = np.zeros(shape, np.uint8)
    cv2.fillPoly(m, [np.round(points_px).astype(np.int32)], 1)
    return m.astype(bool)


@pytest.fixture(scope="module")
def seg_root(tmp_path_factory):
    return generate_dataset(tmp_path_factory.mktemp("gen") / "seg", "segment", 12, 3, seed=7, min_side=96, max_side=160)


def test_layout_and_determinism(tmp_path, seg_root):
    assert len(list((seg_root / "images" / "train").glob("*.jpg"))) == 12
    assert len(list((seg_root / "labels" / "val").glob("*.txt"))) == 3
    again = generate_dataset(tmp_path / "again", "segment", 12, 3, seed=7, min_side=96, max_side=160)
    for f in (seg_root / "labels" / "train").iterdir():
        assert (again / "labels" / "train" / f.name).read_text() == f.read_text()
    a = cv2.imread(str(seg_root / "images" / "train" / "00003.jpg"))
    b = cv2.imread(str(again / "images" / "train" / "00003.jpg"))
    assert np.array_equal(a, b)
    other = generate_dataset(tmp_path / "other", "segment", 2, 1, seed=8, min_side=96, max_side=160)
    assert (other / "labels/train/00000.txt").read_text() != (seg_root / "labels/train/00000.txt").read_text()


def test_polygons_match_drawn_shapes(seg_root):
    for i in range(12):
        img = cv2.imread(str(seg_root / "images" / "train" / f"{i:05d}.jpg"))
        h, w = img.shape[:2]
        _, bg, shapes = render_sample(7, "train", i, 96, 160)
        changed = _changed(img, bg)
        labels = _read_labels(seg_root / "labels" / "train" / f"{i:05d}.txt")
        assert 1 <= len(labels) <= 8 and len(labels) == len(shapes)
        masks = [_raster(lb[1:].reshape(-1, 2) * [w, h], (h, w)) for lb in labels]
        for k, (lb, mask) in enumerate(zip(labels, masks)):
            assert lb[0] in range(len(CLASS_NAMES)) and len(lb) % 2 == 1
            assert changed[mask].mean() > 0.8
            visible = mask & ~np.logical_or.reduce([np.zeros_like(mask)] + masks[k + 1 :])
            visible = cv2.erode(visible.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
            if visible.sum() > 20:  # the visible part has the colour the shape was drawn in
                assert np.abs(np.median(img[visible], 0) - shapes[k].color).max() < 25
        drawn = np.logical_or.reduce(masks)
        grown = cv2.dilate(drawn.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
        assert changed[~grown].mean() < 0.01  # nothing was drawn outside the labelled shapes


def test_detect_boxes_cover_drawn_pixels(tmp_path):
    root = generate_dataset(tmp_path / "det", "detect", 8, 2, seed=3, min_side=96, max_side=128)
    for i in range(8):
        img = cv2.imread(str(root / "images" / "train" / f"{i:05d}.jpg"))
        h, w = img.shape[:2]
        _, bg, _ = render_sample(3, "train", i, 96, 128)
        changed = _changed(img, bg)
        inside = np.zeros((h, w), bool)
        for c, cx, cy, bw, bh in _read_labels(root / "labels" / "train" / f"{i:05d}.txt"):
            assert 0 < bw <= 1 and 0 < bh <= 1 and 0 <= cx - bw / 2 and cx + bw / 2 <= 1
            corners = ((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h)
            x1, y1, x2, y2 = (int(round(v)) for v in corners)
            assert changed[y1 : y2 + 1, x1 : x2 + 1].mean() > 0.3
            inside[max(y1 - 2, 0) : y2 + 3, max(x1 - 2, 0) : x2 + 3] = True
        assert changed[~inside].mean() < 0.01


def test_classify_layout(tmp_path):
    root = generate_dataset(tmp_path / "cls", "classify", 3, 2, seed=0)
    for split, n in (("train", 3), ("val", 2)):
        assert sorted(p.name for p in (root / split).iterdir()) == sorted(CLASS_NAMES)
        for name in CLASS_NAMES:
            files = sorted((root / split / name).glob("*.jpg"))
            assert len(files) == n
            h, w = cv2.imread(str(files[0])).shape[:2]
            assert h == w and 96 <= h <= 128


def test_refuses_to_overwrite_and_cli(tmp_path):
    out = tmp_path / "cli"
    synthetic.main(["--task", "detect", "--out", str(out), "--n-train", "2", "--n-val", "1",
                    "--max-side", "64", "--min-side", "48"])
    assert len(list((out / "labels" / "train").glob("*.txt"))) == 2
    with pytest.raises(FileExistsError):
        generate_dataset(out, "detect", 1, 1)
    assert not list(tmp_path.glob(".*tmp*"))


def test_workers_write_the_same_bytes(tmp_path, monkeypatch):
    import data.synthetic

    one = generate_dataset(tmp_path / "one", "detect", 20, 4, seed=5, min_side=64, max_side=96)
    pools = []
    mp = data.synthetic.multiprocessing
    get_context = mp.get_context
    monkeypatch.setattr(mp, "get_context", lambda method: pools.append(method) or get_context(method))
    monkeypatch.setattr(data.synthetic, "IMAGES_PER_WORKER", 4)  # a pool for 20 images (else one process)
    two = generate_dataset(tmp_path / "two", "detect", 20, 4, seed=5, min_side=64, max_side=96, workers=2)
    assert pools == ["spawn"]  # the train split's 20 images in 2 processes; the 4 val images in this one
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert len(files) == 48 and files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    assert all((one / f).read_bytes() == (two / f).read_bytes() for f in files)


def test_pose_labels_are_rectangle_corners_hidden_where_covered(tmp_path):
    """Pose labels: every instance a rectangle, its 4 keypoints the drawn polygon's corners in its own order, visible
    (2) unless a later shape covers the corner (0); the corner_visibility rule checked on a hand-made overlap."""
    from data.synthetic import POSE_CLASS, Shape, corner_visibility

    root = generate_dataset(tmp_path / "pose", task="pose", n_train=4, n_val=1, seed=0, min_side=96, max_side=128)
    for i in range(4):
        _, _, shapes = render_sample(0, "train", i, 96, 128, task="pose")
        img = cv2.imread(str(root / "images" / "train" / f"{i:05d}.jpg"))
        h, w = img.shape[:2]
        rows = np.loadtxt(root / "labels" / "train" / f"{i:05d}.txt", ndmin=2)
        assert len(rows) == len(shapes) and all(s.cls == POSE_CLASS for s in shapes) and (rows[:, 0] == 0).all()
        kpts = rows[:, 5:].reshape(-1, 4, 3)
        for s, k in zip(shapes, kpts):
            np.testing.assert_allclose(k[:, :2] * (w, h), np.clip(s.polygon, 0, (w, h)), atol=0.01)
        assert set(np.unique(kpts[..., 2])) <= {0, 2}
    square = np.array([[10, 10], [40, 10], [40, 40], [10, 40]], np.float32)
    cover = np.array([[30, 30], [60, 30], [60, 60], [30, 60]], np.float32)  # hides the square's bottom-right
    vis = corner_visibility([Shape(1, square, (0, 0, 255)), Shape(1, cover, (0, 255, 0))], 64, 64)
    np.testing.assert_array_equal(vis[0], [2, 2, 0, 2])
    np.testing.assert_array_equal(vis[1], [2, 2, 2, 2])
