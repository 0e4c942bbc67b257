"""data/label_studio.py: Label Studio's JSON export read natively. Each export is written by the test as Label
Studio writes one (a list of tasks; regions in percent of the image), and every expected label is worked out by hand
from those percentages."""

import json

import cv2
import numpy as np
import pytest

from data.dataset_yaml import check_det_dataset, check_pose_dataset
from data.detect_dataset import YOLODataset
from data.label_formats import PoseLabels
from utils.errors import BadDataset


def rect(label, x, y, w, h, rotation=0, size=None, **extra):
    """A rectanglelabels result as the editor writes it (percent of the image; size: original_width, _height)."""
    r = {"id": f"r{x}{y}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
         "value": {"x": x, "y": y, "width": w, "height": h, "rotation": rotation,
                   "rectanglelabels": label if isinstance(label, list) else [label]}, **extra}
    if size:
        r.update(original_width=size[0], original_height=size[1], image_rotation=0)
    return r


def poly(label, points):
    return {"id": "p1", "type": "polygonlabels", "from_name": "poly", "to_name": "image",
            "value": {"points": points, "polygonlabels": [label]}}


def ann(results, cancelled=False, updated="2024-05-01T10:00:00.000000Z", ann_id=1):
    return {"id": ann_id, "result": results, "was_cancelled": cancelled, "ground_truth": False,
            "created_at": "2024-05-01T09:00:00.000000Z", "updated_at": updated, "completed_by": 1}


def task(task_id, image, *annotations, predictions=()):
    return {"id": task_id, "data": {"image": image}, "annotations": list(annotations),
            "predictions": [{"result": list(p)} for p in predictions], "project": 3}


def image(path, w, h):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.random.default_rng(w * h).integers(0, 255, (h, w, 3), np.uint8))


def export(path, tasks):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tasks))


CAR, PERSON = rect("car", 10, 10, 25, 50, size=(160, 120)), rect("person", 50.625, 20, 37.5, 40)
# the labels of a.jpg (80 x 60): cx = (x + w / 2) / 100, cy = (y + h / 2) / 100, w / 100, h / 100
A_BY_HAND = [[0, 0.225, 0.35, 0.25, 0.5], [1, 0.69375, 0.4, 0.375, 0.4]]


def val_export(root):
    """root/val/: images and an export naming them the ways Label Studio does, each task a case of the policy."""
    val = root / "val"
    for name, (w, h) in {"a.jpg": (80, 60), "b.jpg": (64, 48), "9f8e7d6c-c.jpg": (64, 48), "sub/d.jpg": (64, 48),
                         "e.jpg": (64, 48), "f.jpg": (64, 48), "g.jpg": (64, 48), "h.jpg": (64, 48),
                         "i.jpg": (64, 48), "j.jpg": (64, 48), "k.jpg": (64, 48), "l.jpg": (64, 48),
                         "m.jpg": (64, 48), "n.png": (64, 48), "sub/n.png": (64, 48),
                         "o.jpg": (64, 48), "p.jpg": (64, 48), "q.jpg": (64, 48),
                         "r.jpg": (64, 48), "s.jpg": (64, 48)}.items():
        image(val / name, w, h)
    tasks = [
        # the latest annotation not cancelled is read: not the older one, not the newer cancelled one
        task(1, "/data/upload/3/0a1b2c3d-a.jpg", ann([rect("car", 0, 0, 50, 50)], updated="2024-04-01T00:00:00Z"),
             ann([CAR, PERSON, {"type": "choices", "value": {"choices": ["day"]}}], ann_id=2),
             ann([], cancelled=True, updated="2024-06-01T00:00:00Z", ann_id=3),
             predictions=[[rect("person", 0, 0, 10, 10)]]),
        task(2, "/data/upload/3/1a2b3c4d-b.jpg", ann([poly("person", [[0, 0], [100, 0], [50, 100]])])),
        task(3, "/data/upload/3/9f8e7d6c-c.jpg", ann([])),  # the upload folder's copy; submitted without regions
        task(4, "/data/local-files/?d=photos%2Fsub%2Fd.jpg", ann([rect("car", 95, 10, 20, 20)])),  # 15 % outside
        task(5, "https://example.com/x/e.jpg?X-Amz-Signature=1", ann([rect("car", -0.5, 20, 10, 50)])),  # 0.5 %
        task(6, "/data/upload/3/f.jpg", ann([rect("car", 10, 10, 20, 20, rotation=30)])),
        task(7, "/data/upload/3/g.jpg", ann([rect("bicycle", 10, 10, 20, 20)])),
        task(8, "/data/upload/3/h.jpg"),  # not annotated yet
        task(9, "/data/upload/3/i.jpg", ann([CAR], cancelled=True)),
        task(10, "/data/upload/3/j.jpg", ann([rect("car", 10, 10, 20, 20, size=(100, 100))])),
        task(11, "/data/upload/3/k.jpg", ann([rect("person", 25, 25, 50, 50), {
            "type": "keypointlabels", "value": {"x": 50, "y": 30, "width": 1, "keypointlabels": ["nose"]}}])),
        task(12, "/data/upload/3/l.jpg", ann([CAR])), task(13, "/data/upload/3/l.jpg", ann([PERSON])),
        task(14, "/data/upload/3/m.jpg", ann([{"type": "brushlabels", "value": {"format": "rle", "rle": [0],
                                                                                 "brushlabels": ["car"]}}])),
        task(15, "/data/upload/3/n.png", ann([CAR])),  # two files of that name
        task(16, "/data/upload/3/missing.jpg", ann([CAR])),
        task(17, "/data/upload/3/o.jpg", ann([rect(["car", "person"], 10, 10, 20, 20)])),
        {"id": 18, "data": {"image": "/data/upload/3/p.jpg"}, "annotations": 5},  # not a list: not annotated
        task(19, "/data/upload/3/q.jpg", {"id": 1, "result": {"x": 1}}),
        task(20, "/data/local-files/?d=photos%5Csub%5Cn.png", ann([PERSON])),  # the n.png in sub/ (Windows path)
        task(21, "/data/upload/3/r.jpg", ann([CAR, "car"])),
        task(22, "/data/upload/3/s.jpg", ann([rect("car", 85, 10, 20, 20)])),  # x 85..105 %: cx, w in [0, 1]
    ]
    export(val / "project-3-at-2024-05-01-10-00-5e6f7a8b.json", tasks)
    return val


def train_export(root):
    image(root / "train" / "t1.jpg", 64, 48)
    image(root / "train" / "t2.jpg", 64, 48)
    export(root / "train" / "project-2-at-2024-05-01-10-00-1c2d3e4f.json", [
        task(1, "/data/upload/2/aaaaaaaa-t1.jpg", ann([rect("person", 10, 10, 30, 30), rect("car", 50, 50, 20, 20)])),
        task(2, "/data/upload/2/t2.jpg", ann([rect("truck", 1, 1, 5, 5)], cancelled=True))])  # cancelled: no class


def labels(ds):
    return {lb["im_file"].rsplit("/", 1)[1]: np.hstack([lb["cls"], lb["bboxes"]]) for lb in ds.labels}


@pytest.mark.parametrize("task_name", ["detect", "segment"])
def test_an_export_reads_as_worked_out_by_hand(tmp_path, task_name):
    val = val_export(tmp_path)
    train_export(tmp_path)
    d = check_det_dataset(tmp_path)
    assert d["names"] == {0: "car", 1: "person"}  # the training export's labels, sorted; not the cancelled truck
    assert d["val"] == str(next(val.glob("*.json")))
    ds = YOLODataset(d["val"], imgsz=64, task=task_name, nc=d["nc"], names=d["names"])
    got = labels(ds)
    assert sorted(got) == ["9f8e7d6c-c.jpg", "a.jpg", "b.jpg", "e.jpg", "k.jpg", "n.png"]
    assert [lb["im_file"] for lb in ds.labels if lb["im_file"].endswith("n.png")] == [str(val / "sub" / "n.png")]
    np.testing.assert_allclose(got["a.jpg"], A_BY_HAND, atol=1e-6)  # drawn on a 160 x 120 copy: the same ratio
    np.testing.assert_allclose(got["b.jpg"], [[1, 0.5, 0.5, 1, 1]], atol=1e-6)  # the polygon's envelope
    assert got["9f8e7d6c-c.jpg"].shape == (0, 5)  # a background
    np.testing.assert_allclose(got["e.jpg"], [[0, 0.0475, 0.45, 0.095, 0.5]], atol=1e-6)  # clipped at 0: x 0..0.095
    np.testing.assert_allclose(got["k.jpg"], [[1, 0.5, 0.5, 0.5, 0.5]], atol=1e-6)
    outline = [lb for lb in ds.labels if lb["im_file"].endswith("b.jpg")][0]["segments"]
    if task_name == "segment":
        np.testing.assert_allclose(outline[0], [[0, 0], [1, 0], [0.5, 1]], atol=1e-6)
    else:
        assert outline is None
    assert {k: ds.stats[k] for k in ("images", "backgrounds", "skipped", "clipped", "ignored")} == {
        "images": 6, "backgrounds": 1, "skipped": 9, "clipped": 1, "ignored": 6}
    problems = "\n".join(ds.problems)
    file = next(val.glob("*.json"))
    for case in [
        "a.jpg: kept, 2 other annotations of task 1 not read (the latest one not cancelled is)",
        f"d.jpg: skipped, {file}: task 4 result 1: box corners outside [0, 1] (0.1..1.15 of the image)",
        f"s.jpg: skipped, {file}: task 22 result 1: box corners outside [0, 1] (0.1..1.05 of the image)",
        f"f.jpg: skipped, {file}: task 6 result 1: a box rotated 30 degrees",
        f"g.jpg: skipped, {file}: task 7 result 1: class 'bicycle' is not a class of this dataset (car, person)",
        f"{file}: task 8 (h.jpg): ignored, not annotated",
        f"{file}: task 9 (i.jpg): ignored, its 1 annotations are all cancelled (the task was skipped)",
        f"j.jpg: skipped, {file}: task 10 result 1: drawn on a 100x100 image, this one is 64x48",
        "k.jpg: kept, 1 key points not read",
        f"l.jpg: ignored, named by 2 annotated tasks of {file} (12, 13)",
        f"m.jpg: skipped, {file}: task 14 result 1: a brushlabels region is not read as an object",
        f"{file}: task 15: ignored, 2 images named n.png",
        f"{file}: task 16: ignored, no image named missing.jpg under {val}",
        f"o.jpg: skipped, {file}: task 17 result 1: a region needs one label, this has 2",
        f"{file}: task 18 (p.jpg): ignored, not annotated",
        f"q.jpg: skipped, {file}: task 19: its annotation's result is not a list",
        f"r.jpg: skipped, {file}: task 21 result 2: not an object",
    ]:
        assert case in problems, case
    assert (val / "project-3-at-2024-05-01-10-00-5e6f7a8b.yolo-engine.cache").is_file()
    assert YOLODataset(d["val"], imgsz=64, task=task_name, nc=d["nc"], names=d["names"]).stats["cached"]


def test_layouts_found_and_refused(tmp_path):
    """Exports named after their split at the top with the images anywhere below, found as the split folders are;
    one export for both splits, an export without a split word, a pose run, JSON-MIN and broken JSON: one error each,
    saying what to do."""
    root = tmp_path / "top"
    for split, names in (("train", ["x.jpg", "y.jpg"]), ("val", ["z.jpg"])):
        for n in names:
            image(root / "images" / split / n, 64, 48)
        export(root / f"{split}.json", [task(i, f"/data/local-files/?d=images/{split}/{n}", ann([CAR]))
                                         for i, n in enumerate(names, 1)])
    d = check_det_dataset(root)
    assert (d["train"], d["val"], d["names"]) == (str(root / "train.json"), str(root / "val.json"), {0: "car"})
    ds = YOLODataset(d["train"], imgsz=64, nc=1, names=d["names"])
    assert sorted(labels(ds)) == ["x.jpg", "y.jpg"]  # the export's tasks, not every image below its folder

    refusals = {"one": ("project-1-at-2024-05-01-10-00-0a0b0c0d.json", [task(1, "x.jpg", ann([CAR]))],
                        "not one for training and another for validation"),
                "both": ("trainval.json", [task(1, "x.jpg", ann([CAR]))],
                         "not one for training and another for validation"),
                "min": ("train.json", [{"image": "/data/upload/1/x.jpg", "id": 1, "label": [CAR["value"]]}],
                        "export the project as JSON"),
                "broken": ("train.json", "[{", "not a readable Label Studio JSON file")}
    for case, (name, tasks, message) in refusals.items():
        folder = tmp_path / case
        (folder / name).parent.mkdir(parents=True)
        (folder / name).write_text(tasks if isinstance(tasks, str) else json.dumps(tasks))
        if case in ("min", "broken"):
            export(folder / "val.json", [task(1, "z.jpg", ann([CAR]))])
        with pytest.raises(BadDataset, match=message):
            check_det_dataset(folder)
    with pytest.raises(BadDataset, match="not read for pose"):
        check_pose_dataset(root)
    with pytest.raises(BadDataset, match="pose reads no Label Studio JSON export"):  # named in a pose YAML
        YOLODataset(d["val"], imgsz=64, task=PoseLabels((4, 3), [0, 1, 2, 3]), nc=1, names=d["names"])


def test_training_from_a_label_studio_folder(tmp_path):
    """`train.py --data <folder>` of split folders each holding an export: trained under the export's label names, and
    data_problems.txt names what each split left out."""
    import train

    val = val_export(tmp_path / "ls")
    train_export(tmp_path / "ls")
    trainer, _ = train.main(train.parse_opt([
        "--data", str(tmp_path / "ls"), "--cfg", "yolov8n.yaml", "--imgsz", "64", "--batch-size", "4",
        "--epochs", "1", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"), "--noplots"]))
    assert trainer.names == {0: "car", 1: "person"}
    problems = (trainer.save_dir / "data_problems.txt").read_text()
    file = next(val.glob("*.json"))
    assert f"val: {val / 'f.jpg'}: skipped, {file}: task 6 result 1: a box rotated 30 degrees" in problems
    assert f"train: {tmp_path / 'ls' / 'train'}" in problems
    assert "task 2 (t2.jpg): ignored, its 1 annotations are all cancelled" in problems
