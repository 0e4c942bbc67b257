"""data/annotations.py: COCO JSON and Pascal VOC XML read natively, Roboflow's data.yaml, and a --data folder
whose layout is found by itself. Every dataset here is written by the test from the synthetic generator's drawn
shapes (data/synthetic.render_sample), in each format's own conventions; the expected labels are the ones the
generator writes in YOLO format for the same images."""

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from data.annotations import find_layout, merge_parts
from data.dataset_yaml import check_det_dataset, check_pose_dataset
from data.detect_dataset import YOLODataset
from data.label_formats import PoseLabels
from data.synthetic import CLASS_NAMES, POSE_FLIP_IDX, corner_visibility, generate_dataset, render_sample
from utils.errors import BadDataset

SIDES = (64, 96)
# COCO ids need be neither contiguous nor in name order: classes follow the ids' order
CAT_IDS = {"circle": 7, "rectangle": 2, "triangle": 5}
ID_ORDER = sorted(CAT_IDS, key=CAT_IDS.get)  # rectangle, triangle, circle
CORNERS = ["left_top", "right_top", "right_bottom", "left_bottom"]  # the pose set's corners; flips pair left/right


def shapes(seed, split, i, task="detect"):
    """The generator's image i of its train or val split (whichever the format's split name says)."""
    img, _, drawn = render_sample(seed, "train" if "train" in split else "val", i, *SIDES, task=task)
    return img, drawn


def write_image(path, img):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), img)


def box_of(polygon, w, h):
    p = np.clip(polygon, 0, [w, h])
    (x1, y1), (x2, y2) = p.min(0), p.max(0)
    return float(x1), float(y1), float(x2), float(y2)


def coco_split(root, split, n, seed, task="detect", images_dir=None, edit=None):
    """Images in root/<split>/ (or images_dir) and root/annotations/<prefix>_<split>.json, as COCO writes them."""
    images, anns = [], []
    folder = images_dir or root / split
    for i in range(n):
        img, drawn = shapes(seed, split, i, task)
        h, w = img.shape[:2]
        write_image(folder / f"{i:05d}.jpg", img)
        images.append({"id": 100 + i, "file_name": f"{i:05d}.jpg", "width": w, "height": h})
        vis = corner_visibility(drawn, h, w) if task == "pose" else [None] * len(drawn)
        for s, v in zip(drawn, vis):
            x1, y1, x2, y2 = box_of(s.polygon, w, h)
            a = {"id": len(anns) + 1, "image_id": 100 + i, "category_id": CAT_IDS[CLASS_NAMES[s.cls]],
                 "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0,
                 "segmentation": [np.clip(s.polygon, 0, [w, h]).reshape(-1).tolist()]}
            if task == "pose":
                a["keypoints"] = [float(x) for (px, py), vv in zip(s.polygon, v) for x in (px, py, vv)]
            anns.append(a)
    cats = [{"id": c, "name": n, "supercategory": "shape"} for n, c in CAT_IDS.items()]
    if task == "pose":
        cats = [{"id": CAT_IDS["rectangle"], "name": "rectangle", "keypoints": CORNERS, "skeleton": [[1, 2], [2, 3]]}]
    d = {"images": images, "annotations": anns, "categories": cats}
    if edit:
        edit(d)
    prefix = "person_keypoints" if task == "pose" else "instances"
    out = root / "annotations" / f"{prefix}_{split}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(d))
    return d


def yolo_reference(tmp_path, task, n_train, n_val, seed):
    """The generator's own YOLO dataset of the same images (its labels are the expected ones)."""
    return generate_dataset(tmp_path / f"ref-{task}", task, n_train, n_val, seed=seed, min_side=SIDES[0],
                            max_side=SIDES[1])


def records(ds):
    return {lb["im_file"].rsplit("/", 1)[1]: lb for lb in ds.labels}


def remap(cls, order):
    """Generator class ids -> the dataset's ids when its names are `order`."""
    return np.array([order.index(CLASS_NAMES[int(c)]) for c in cls.reshape(-1)])


@pytest.mark.parametrize("task", ["detect", "segment"])
def test_a_coco_folder_reads_as_the_same_yolo_labels(tmp_path, task):
    root = tmp_path / "coco"
    for split, n in (("train2017", 3), ("val2017", 3)):
        coco_split(root, split, n, seed=4, task=task, images_dir=root / "images" / split)
    d = check_det_dataset(root)
    assert d["names"] == dict(enumerate(ID_ORDER)) and d["train"] == str(root / "images" / "train2017")
    ds = YOLODataset(d["val"], imgsz=64, task=task, nc=d["nc"], names=d["names"])
    ref = YOLODataset(str(yolo_reference(tmp_path, task, 1, 3, 4) / "images" / "val"), imgsz=64, task=task)
    ours, theirs = records(ds), records(ref)
    assert sorted(ours) == sorted(theirs) and ds.stats["skipped"] == 0
    for name, lb in ours.items():
        np.testing.assert_array_equal(lb["cls"].reshape(-1), remap(theirs[name]["cls"], ID_ORDER))
        np.testing.assert_allclose(lb["bboxes"], theirs[name]["bboxes"], atol=2e-6)
        if task == "segment":
            for a, b in zip(lb["segments"], theirs[name]["segments"]):
                np.testing.assert_allclose(a, b, atol=2e-6)
    assert (root / "annotations" / "instances_val2017.yolo-engine.cache").is_file()  # converted once
    again = YOLODataset(d["val"], imgsz=64, task=task, nc=d["nc"], names=d["names"])
    assert again.stats["cached"]


def test_coco_keypoints_for_pose_with_flip_idx_from_the_names(tmp_path):
    root = tmp_path / "coco-pose"
    for split in ("train", "val"):
        coco_split(root, split, 3, seed=5, task="pose")
    d = check_pose_dataset(root)
    assert d["kpt_shape"] == [4, 3] and d["flip_idx"] == list(POSE_FLIP_IDX) and d["skeleton"] == [[0, 1], [1, 2]]
    fmt = PoseLabels(d["kpt_shape"], d["flip_idx"])
    ds = YOLODataset(d["val"], imgsz=64, task=fmt, nc=d["nc"], names=d["names"])
    ref = YOLODataset(str(yolo_reference(tmp_path, "pose", 1, 3, 5) / "images" / "val"), imgsz=64,
                      task=PoseLabels((4, 3), POSE_FLIP_IDX))
    ours, theirs = records(ds), records(ref)
    assert sorted(ours) == sorted(theirs)
    for name, lb in ours.items():
        np.testing.assert_allclose(lb["bboxes"], theirs[name]["bboxes"], atol=2e-6)
        np.testing.assert_allclose(lb["keypoints"], theirs[name]["keypoints"], atol=2e-6)
    with pytest.raises(BadDataset, match="annotations/instances_<split>.json"):  # a detector finds no box files
        check_det_dataset(root)


def voc_dataset(root, splits, seed, edit=None):
    """VOC's layout: JPEGImages/, Annotations/<id>.xml with 1-based corners, ImageSets/Main/<split>.txt ids."""
    for split, n in splits.items():
        ids = []
        for i in range(n):
            img, drawn = shapes(seed, split, i)
            h, w = img.shape[:2]
            image_id = f"{split}_{i:03d}"
            ids.append(image_id)
            write_image(root / "JPEGImages" / f"{image_id}.jpg", img)
            objects = []
            for s in drawn:
                x1, y1, x2, y2 = box_of(s.polygon, w, h)
                objects.append(f"<object><name>{CLASS_NAMES[s.cls]}</name><difficult>0</difficult><bndbox>"
                               f"<xmin>{x1 + 1:.4f}</xmin><ymin>{y1 + 1:.4f}</ymin><xmax>{x2 + 1:.4f}</xmax>"
                               f"<ymax>{y2 + 1:.4f}</ymax></bndbox></object>")
            xml = (f"<annotation><filename>{image_id}.jpg</filename><size><width>{w}</width><height>{h}</height>"
                   f"<depth>3</depth></size>{''.join(objects)}</annotation>")
            if edit:
                xml = edit(split, i, xml)
            (root / "Annotations").mkdir(parents=True, exist_ok=True)
            (root / "Annotations" / f"{image_id}.xml").write_text(xml)
        (root / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(ids) + "\n")


def test_a_voc_folder_reads_as_the_same_yolo_labels(tmp_path):
    root = tmp_path / "VOC2012"
    voc_dataset(root, {"train": 3, "val": 3}, seed=6)
    d = check_det_dataset(root)
    names_found = sorted({CLASS_NAMES[s.cls] for i in range(3) for s in shapes(6, "train", i)[1]})
    assert d["names"] == dict(enumerate(names_found))
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    ref = records(YOLODataset(str(yolo_reference(tmp_path, "detect", 1, 3, 6) / "images" / "val"), imgsz=64))
    assert ds.stats["images"] == 3 and (root / "ImageSets" / "Main" / "val.yolo-engine.cache").is_file()
    for lb in ds.labels:
        theirs = ref[lb["im_file"].rsplit("_", 1)[1].replace(".jpg", "").zfill(5) + ".jpg"]
        ok = np.isin(theirs["cls"].reshape(-1), [CLASS_NAMES.index(n) for n in names_found])
        if not ok.all():
            continue  # a class training lacks: that image is skipped (tested below), not compared here
        np.testing.assert_array_equal(lb["cls"].reshape(-1), remap(theirs["cls"], names_found))
        np.testing.assert_allclose(lb["bboxes"], theirs["bboxes"], atol=1e-4)


def voc_object(name, corners, *tags):
    x1, y1, x2, y2 = corners
    return (f"<object><name>{name}</name>{''.join(tags)}<bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax>"
            f"<ymax>{y2}</ymax></bndbox></object>")


def test_voc_files_as_labelimg_and_cvat_write_them_read_as_worked_out_by_hand(tmp_path):
    """Whole-pixel 1-based corners; `truncated` objects kept (VOC scores them), `difficult` ones left out, a missing
    <difficult> read as 0, a person's <part> boxes not objects, a class name the training split lacks skipping its
    image. Boxes as the peers convert VOC: centre (xmin + xmax) / 2 - 1, width xmax - xmin, over the image's size."""
    root = tmp_path / "voc"
    head = "<part><name>head</name><bndbox><xmin>12</xmin><ymin>22</ymin><xmax>20</xmax><ymax>30</ymax></bndbox></part>"
    files = {
        "a": (80, 60, [voc_object("person", (11, 21, 50, 40), "<pose>Left</pose><truncated>1</truncated>",
                                  "<difficult>0</difficult>", head),
                       voc_object("car", (1, 1, 80, 60), "<occluded>0</occluded>"),
                       voc_object("car", (30, 30, 40, 40), "<difficult>1</difficult>")]),
        "b": (64, 48, [voc_object("bicycle", (5, 5, 20, 20))]),
        "c": (0, 0, [voc_object("car", (9, 9, 41, 25))]),  # LabelImg's size of a .jpg that holds a PNG
    }
    for image_id, (w, h, objects) in files.items():
        write_image(root / "JPEGImages" / f"{image_id}.jpg", np.zeros((h or 32, w or 48, 3), np.uint8))
        (root / "Annotations").mkdir(parents=True, exist_ok=True)
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><folder>VOC2012</folder><filename>{image_id}.jpg</filename><size><width>{w}</width>"
            f"<height>{h}</height><depth>3</depth></size><segmented>0</segmented>{''.join(objects)}</annotation>")
    (root / "ImageSets" / "Main").mkdir(parents=True)
    (root / "ImageSets" / "Main" / "train.txt").write_text("a\n")
    (root / "ImageSets" / "Main" / "val.txt").write_text("a\nb\nc\n")
    d = check_det_dataset(root)
    assert d["names"] == {0: "car", 1: "person"}  # the training split's names, sorted
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    lb, zero = sorted(ds.labels, key=lambda r: r["im_file"])
    np.testing.assert_allclose(zero["bboxes"], [[24 / 48, 16 / 32, 32 / 48, 16 / 32]], atol=1e-6)  # its decoded size
    order = np.argsort(lb["cls"].reshape(-1))
    np.testing.assert_array_equal(lb["cls"].reshape(-1)[order], [0, 1])
    np.testing.assert_allclose(lb["bboxes"][order], [[39.5 / 80, 29.5 / 60, 79 / 80, 59 / 60],  # car: the whole image
                                                     [29.5 / 80, 29.5 / 60, 39 / 80, 19 / 60]], atol=1e-6)
    assert ds.stats["left_out"] == 1 and ds.stats["skipped"] == 1
    problems = _problems(ds)
    assert "a.jpg: kept, 1 difficult objects left out" in problems
    assert f"b.jpg: skipped, {root / 'Annotations' / 'b.xml'} object 1: class 'bicycle' is not a class of this " \
           "dataset (car, person)" in problems


def test_a_cvat_voc_export_names_its_labelmap_classes_and_ids_in_sub_folders(tmp_path):
    """CVAT's Pascal VOC 1.1 export: labelmap.txt lists the task's labels (after `background`, no object), so a class
    only the val split holds is a class, not a reason to skip its image; an image id that names a sub-folder (an
    uploaded archive's folders) is found in JPEGImages/ and Annotations/ alike; the subsets Train and Validation are
    the splits (car_Train.txt: a per-class list). Float corners, as CVAT writes them."""
    root = tmp_path / "cvat"
    files = {("train", "batch1/a"): (80, 60, [voc_object("car", (10.5, 20.25, 50.5, 40.25))]),
             ("validation", "b"): (64, 48, [voc_object("zebra", (5, 5, 21, 29)), voc_object("car", (1, 1, 64, 48))])}
    lists = {}
    for (split, image_id), (w, h, objects) in files.items():
        write_image(root / "JPEGImages" / f"{image_id}.jpg", np.zeros((h, w, 3), np.uint8))
        (root / "Annotations" / image_id).parent.mkdir(parents=True, exist_ok=True)
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><filename>{image_id.split('/')[-1]}.jpg</filename><size><width>{w}</width><height>{h}"
            f"</height><depth></depth></size>{''.join(objects)}</annotation>")
        lists.setdefault(split, []).append(image_id)
    (root / "ImageSets" / "Main").mkdir(parents=True)
    for split, ids in lists.items():  # CVAT's subsets as its UI names them, and their per-class lists
        (root / "ImageSets" / "Main" / f"{split.title()}.txt").write_text("\n".join(ids) + "\n")
        (root / "ImageSets" / "Main" / f"car_{split.title()}.txt").write_text("".join(f"{i} 1\n" for i in ids))
    (root / "labelmap.txt").write_text("# label:color_rgb:parts:actions\nbackground:0,0,0::\nzebra:1,2,3::\n"
                                       "bus:::\ncar:250,50,83::\n")
    d = check_det_dataset(root)
    assert d["names"] == {0: "zebra", 1: "bus", 2: "car"}  # labelmap.txt's order
    got = {}
    for split in ("train", "val"):
        ds = YOLODataset(d[split], imgsz=64, nc=d["nc"], names=d["names"])
        assert ds.stats["skipped"] == ds.stats["ignored"] == 0
        got.update({name: sorted(zip(lb["cls"].reshape(-1).tolist(), lb["bboxes"].tolist()))
                    for name, lb in records(ds).items()})
    # centre (xmin + xmax) / 2 - 1, width xmax - xmin, over the image's size
    want = {"a.jpg": [(2, [29.5 / 80, 29.25 / 60, 40 / 80, 20 / 60])],
            "b.jpg": [(0, [12 / 64, 16 / 48, 16 / 64, 24 / 48]), (2, [31.5 / 64, 23.5 / 48, 63 / 64, 47 / 48])]}
    assert sorted(got) == sorted(want)
    for name, rows in want.items():
        assert [c for c, _ in got[name]] == [c for c, _ in rows]
        np.testing.assert_allclose([b for _, b in got[name]], [b for _, b in rows], atol=1e-6)


def test_coco_images_of_one_name_in_sub_folders_get_their_own_boxes(tmp_path):
    """CVAT keeps an uploaded archive's folders in `file_name` (a/0001.jpg, b/0001.jpg): each image gets the boxes of
    the entry whose file_name ends its path (one name used to give both the last entry's boxes); two entries that
    name one image alike (c/0001.jpg twice) skip it, named."""
    root = tmp_path / "cvat"
    entries = [("a/0001.jpg", [8, 6, 20, 30]), ("b/0001.jpg", [30, 12, 30, 24]), ("0002.jpg", [0, 0, 64, 48]),
               ("c/0001.jpg", [1, 1, 10, 10]), ("c/0001.jpg", [2, 2, 10, 10])]
    images, anns = [], []
    for k, (name, bbox) in enumerate(entries, 1):
        write_image(root / "images" / "train" / name, np.zeros((48, 64, 3), np.uint8))
        images.append({"id": k, "file_name": name, "width": 64, "height": 48})
        anns.append({"id": k, "image_id": k, "category_id": 1, "bbox": bbox, "iscrowd": 0, "segmentation": []})
    (root / "annotations").mkdir()
    (root / "annotations" / "instances_train.json").write_text(json.dumps(
        {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "car"}]}))
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, nc=1, names={0: "car"})
    got = {str(Path(lb["im_file"]).relative_to(root / "images" / "train")): lb["bboxes"].tolist() for lb in ds.labels}
    want = {"a/0001.jpg": [(8 + 10) / 64, (6 + 15) / 48, 20 / 64, 30 / 48],
            "b/0001.jpg": [(30 + 15) / 64, (12 + 12) / 48, 30 / 64, 24 / 48], "0002.jpg": [0.5, 0.5, 1, 1]}
    assert sorted(got) == sorted(want)
    for name, box in want.items():
        np.testing.assert_allclose(got[name], [box], atol=1e-6)
    assert ds.stats["skipped"] == 1 and any(
        p.startswith(f"{root / 'images' / 'train' / 'c' / '0001.jpg'}: skipped, ") and "4 images are named 0001.jpg"
        in p for p in ds.problems)


def test_a_box_reaching_past_the_image_by_more_than_1_percent_skips_it(tmp_path):
    """The 1 % rule judges a converted box's corners: x 40..70 on a 64 px image has cx, w in [0, 1] and was clipped
    to 40..64, now it skips the image (COCO and VOC); 0.5 px past the edge is clipped and counted; CVAT's 0-based
    VOC corners 0..64 are inside."""
    root = tmp_path / "coco"
    boxes = {"far.jpg": [40, 12, 30, 24], "near.jpg": [40, 12, 24.5, 24]}
    for name in boxes:
        write_image(root / "images" / "train" / name, np.zeros((48, 64, 3), np.uint8))
    (root / "annotations").mkdir()
    (root / "annotations" / "instances_train.json").write_text(json.dumps({
        "images": [{"id": k, "file_name": n, "width": 64, "height": 48} for k, n in enumerate(boxes)],
        "annotations": [{"id": k, "image_id": k, "category_id": 1, "bbox": b, "iscrowd": 0}
                        for k, b in enumerate(boxes.values())], "categories": [{"id": 1, "name": "car"}]}))
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, nc=1, names={0: "car"})
    assert [Path(lb["im_file"]).name for lb in ds.labels] == ["near.jpg"] and ds.stats["clipped"] == 1
    assert any("far.jpg: skipped, " in p and "annotation 0: box corners outside [0, 1] (0.25..1.09 of the image)" in p
               for p in ds.problems)
    voc = tmp_path / "voc"
    for image_id, corners in {"far": (40, 5, 70, 20), "cvat": (0, 0, 64, 48)}.items():
        write_image(voc / "JPEGImages" / f"{image_id}.jpg", np.zeros((48, 64, 3), np.uint8))
        (voc / "Annotations").mkdir(exist_ok=True)
        (voc / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><size><width>64</width><height>48</height></size>{voc_object('car', corners)}</annotation>")
    (voc / "ImageSets" / "Main").mkdir(parents=True)
    (voc / "ImageSets" / "Main" / "val.txt").write_text("far\ncvat\n")
    ds = YOLODataset(str(voc / "ImageSets" / "Main" / "val.txt"), imgsz=64, nc=1, names={0: "car"})
    assert [Path(lb["im_file"]).name for lb in ds.labels] == ["cvat.jpg"]
    assert any("far.xml object 1: box corners outside [0, 1]" in p for p in ds.problems)


def test_annotated_images_the_split_lacks_are_named(tmp_path):
    """A COCO file listing an annotated image that is not in the images folder (an export without its images, a
    copy cut short): its objects are trained nowhere, so it is named and counted as ignored, from the cache too; a
    listed image without annotations missing is no loss."""
    root = tmp_path / "coco"
    d = coco_split(root, "val", 3, seed=5, edit=lambda d: d["images"].append(
        {"id": 999, "file_name": "background.jpg", "width": 64, "height": 64}))
    (root / "val" / "00001.jpg").unlink()
    for cached in (False, True):
        ds = YOLODataset(str(root / "val"), imgsz=64, nc=3, names=dict(enumerate(CLASS_NAMES)))
        assert (ds.stats["cached"], ds.stats["images"], ds.stats["ignored"]) == (cached, 2, 1)
        n = sum(a["image_id"] == 101 for a in d["annotations"])
        assert ds.problems == [f"{root / 'annotations' / 'instances_val.json'}: image 00001.jpg: ignored, listed "
                               f"with {n} annotations, but the split holds no image of that name"]


def _problems(ds):
    return "\n".join(ds.problems)


def test_coco_bad_input_policy(tmp_path):
    """Each case counted and named: a box outside the image skips it, a crowd annotation is left out, a category the
    dataset does not name skips the image, a listed size that is not the image's skips it, an image the file does
    not list is a background."""
    def edit(d):
        anns = {a["image_id"]: a for a in d["annotations"]}
        anns[100]["bbox"][0] += 10_000  # image 0: outside
        anns[101]["iscrowd"] = 1  # image 1: a crowd region
        d["categories"].append({"id": 99, "name": "hexagon"})
        anns[102]["category_id"] = 99  # image 2: not one of the dataset's names
        d["images"][3]["width"] += 1  # image 3: another size
        d["images"].pop(4)  # image 4: not listed
    root = tmp_path / "coco"
    d = coco_split(root, "val", 6, seed=7, edit=edit)
    names = dict(enumerate(CLASS_NAMES))
    ds = YOLODataset(str(root / "val"), imgsz=64, nc=3, names=names)
    problems = _problems(ds)
    assert ds.stats["skipped"] == 3 and ds.stats["left_out"] == 1 and ds.stats["unlabelled"] == 1
    assert "00000.jpg: skipped, " in problems and "box corners outside [0, 1]" in problems
    assert "00002.jpg: skipped, " in problems and "class 'hexagon' is not a class of this dataset" in problems
    assert "00003.jpg: skipped, " in problems and "its boxes would be misplaced" in problems
    assert "00001.jpg: kept, 1 crowd annotations left out" in problems
    kept = records(ds)
    crowd_image = [a for a in d["annotations"] if a["image_id"] == 101]
    assert len(kept["00001.jpg"]["cls"]) == len(crowd_image) - 1 and len(kept["00004.jpg"]["cls"]) == 0


def test_voc_bad_input_policy(tmp_path):
    """difficult objects are left out and counted; a class name the training split never has skips the image; XML
    that declares entities (a billion-laughs file) is never parsed; broken XML is named."""
    laughs = ('<?xml version="1.0"?><!DOCTYPE a [<!ENTITY l "lol"><!ENTITY l2 "&l;&l;&l;&l;&l;&l;&l;&l;">]>'
              '<annotation>&l2;</annotation>')

    def edit(split, i, xml):
        if split != "val":
            return xml
        return {0: xml.replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1),
                1: xml.replace("<name>", "<name>hexagon", 1), 2: laughs, 3: xml[:-5]}.get(i, xml)
    root = tmp_path / "voc"
    voc_dataset(root, {"train": 4, "val": 5}, seed=8, edit=edit)
    d = check_det_dataset(root)
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    problems = _problems(ds)
    assert ds.stats["left_out"] == 1 and "val_000.jpg: kept, 1 difficult objects left out" in problems
    assert "val_001.jpg: skipped, " in problems and "class 'hexagon" in problems
    assert "val_002.jpg: skipped, " in problems and "declares a DOCTYPE or entities" in problems
    assert "val_003.jpg: skipped, " in problems and "not well-formed XML" in problems
    assert ds.stats["skipped"] >= 3 and "val_004.jpg" in records(ds)


def test_roboflow_coco_export_drops_its_supercategory(tmp_path):
    """Roboflow's COCO export: <split>/_annotations.coco.json beside the images, plus a category 0 named after the
    project that is only the others' supercategory."""
    root = tmp_path / "rf"
    for split in ("train", "valid"):
        d = coco_split(root, split, 2, seed=9)
        d["categories"].append({"id": 0, "name": "shape", "supercategory": "none"})
        # as COCO's `person`: its own supercategory, a class even where this file annotates none
        d["categories"].append({"id": 50, "name": "hexagon", "supercategory": "hexagon"})
        (root / split / "_annotations.coco.json").write_text(json.dumps(d))
        (root / "annotations" / f"instances_{split}.json").unlink()
    d = check_det_dataset(root)
    assert d["names"] == dict(enumerate([*ID_ORDER, "hexagon"])) and d["val"] == str(root / "valid")
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    assert ds.stats["images"] == 2 and ds.stats["skipped"] == 0
    assert not any("_annotations" in p for p in ds.problems)  # the label file and its cache are no strays


def roboflow_yolo(root, seed=10):
    """Roboflow's YOLO export: data.yaml beside train/ valid/ test/ (images/, labels/ each), splits `../x/images`,
    `nc` and a list of names, and a roboflow: block."""
    ref = generate_dataset(root.parent / "src", "detect", 4, 2, seed=seed, min_side=SIDES[0], max_side=SIDES[1])
    for src, dst in (("train", "train"), ("val", "valid"), ("val", "test")):
        for kind in ("images", "labels"):
            (root / dst / kind).mkdir(parents=True)
            for f in (ref / kind / src).iterdir():
                (root / dst / kind / f.name).write_bytes(f.read_bytes())
    (root / "data.yaml").write_text(yaml.safe_dump({
        "train": "../train/images", "val": "../valid/images", "test": "../test/images", "nc": 3,
        "names": list(CLASS_NAMES), "roboflow": {"workspace": "w", "project": "p", "version": 1}}))
    return root


def test_roboflow_data_yaml_resolves_as_ultralytics_does(tmp_path, yolo_log):
    root = roboflow_yolo(tmp_path / "rf")
    for data in (root / "data.yaml", root):  # the YAML, or the folder holding it
        d = check_det_dataset(data)
        assert (d["train"], d["val"], d["test"]) == tuple(str(root / s / "images") for s in ("train", "valid", "test"))
        assert d["names"] == dict(enumerate(CLASS_NAMES)) and d["nc"] == 3
    text = "\n".join(yolo_log)
    assert "'roboflow' not read by this project (ignored)" in text
    assert "val ../valid/images is not found from" in text and "reading valid/images" in text


def test_layouts_are_found_and_nothing_else(tmp_path):
    (tmp_path / "two").mkdir()
    for n in ("a.yaml", "b.yaml"):
        (tmp_path / "two" / n).write_text("x: 1\n")
    with pytest.raises(BadDataset, match="2 YAML files found"):
        find_layout(tmp_path / "two")
    assert find_layout(roboflow_yolo(tmp_path / "rf")) == (None, tmp_path / "rf" / "data.yaml")
    (tmp_path / "unzipped").mkdir()  # a Roboflow archive unpacked into a folder of its own
    roboflow_yolo(tmp_path / "unzipped" / "Shapes.v3i.yolov8")
    with pytest.raises(BadDataset, match=r"; it holds Shapes\.v3i\.yolov8/data\.yaml: give that file, or its folder, "
                                         "as --data"):
        find_layout(tmp_path / "unzipped")
    # CVAT's export of a task without subsets: one split, `default`; the error names the files found
    for f in ("annotations/instances_default.json", "images/default/a.jpg", "Annotations/a.xml", "JPEGImages/a.jpg",
              "ImageSets/Main/default.txt", "ImageSets/Main/car_default.txt"):
        (tmp_path / "cvat" / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cvat" / f).write_text("{}")
    with pytest.raises(BadDataset, match=r"holds annotations/instances_default\.json, ImageSets/Main/default\.txt, but "
                                         "not a training and a validation split"):
        find_layout(tmp_path / "cvat")


def test_yolo_labels_win_over_an_annotation_file(tmp_path):
    """Ultralytics' COCO download holds both labels/val2017/ and annotations/instances_val2017.json: the YOLO labels
    it trained with stay what is read."""
    root = tmp_path / "coco"
    coco_split(root, "val2017", 2, seed=11, images_dir=root / "images" / "val2017")
    (root / "labels" / "val2017").mkdir(parents=True)
    ds = YOLODataset(str(root / "images" / "val2017"), imgsz=64, nc=3, names=dict(enumerate(CLASS_NAMES)))
    assert ds.stats["unlabelled"] == 2  # the empty labels folder was read, not the JSON


def test_merged_polygon_parts_fill_their_union():
    """Parts of one object joined into one outline fill what the parts fill, plus the one-pixel lines of the seams
    (which have no width, and join the nearest vertices: here 10.4 and 11.2 pixels long)."""
    a = np.array([[2, 2], [20, 2], [20, 20], [2, 20]], float)
    b = np.array([[30, 25], [45, 25], [40, 40]], float)
    c = np.array([[5, 30], [15, 30], [15, 45], [5, 45]], float)
    merged = merge_parts([a, b, c])

    def fill(polys):
        m = np.zeros((50, 50), np.uint8)
        for p in polys:
            cv2.fillPoly(m, [np.round(p * 16).astype(np.int32)], 1, cv2.LINE_8, shift=4)
        return m
    union, one = fill([a, b, c]), fill([merged])
    assert (one >= union).all() and 0 < (one > union).sum() <= 2 * (11 + 12)
    assert len(merged) == len(a) + len(b) + len(c) + 2 * 2  # each join walks there and back


# Annotation-tool exports, checked against boxes worked out by hand. Each image: (name, width, height, objects as
# (class name, COCO bbox [x, y, width, height] in pixels)); d.jpg holds a box reaching 26 px past its right edge.
TOOL_IMAGES = [("a.jpg", 80, 60, [("car", [8, 6, 20, 30]), ("person", [40.5, 12, 30, 24])]),
               ("b.jpg", 64, 48, [("person", [0, 0, 64, 48])]),
               ("c.jpg", 64, 48, []),  # listed with no annotation: a background
               ("d.jpg", 64, 48, [("car", [70, 5, 20, 10])])]
# YOLO's cx cy w h of those boxes: (x + w / 2) / W, (y + h / 2) / H, w / W, h / H
BY_HAND = {"a.jpg": [("car", 0.225, 0.35, 0.25, 0.5), ("person", 0.69375, 0.4, 0.375, 0.4)],
           "b.jpg": [("person", 0.5, 0.5, 1.0, 1.0)], "c.jpg": []}


def tool_export(root, split, tool):
    """A COCO file as the tool writes it, for the images of TOOL_IMAGES (noise) in images/<split>/.
    cvat: categories and images numbered from 1 in label order (person, car), boxes with an empty `segmentation`
    and `attributes`, a mask as a crowd annotation in uncompressed RLE. label-studio: categories numbered from 0 in
    name order, images from 0, file names under `images/` (b.jpg's written on Windows), an `ignore` key."""
    cvat = tool == "cvat"
    order = ["person", "car"] if cvat else ["car", "person"]
    cats = [{"id": i + cvat, "name": n, "supercategory": ""} if cvat else {"id": i, "name": n}
            for i, n in enumerate(order)]
    images, anns = [], []
    for k, (name, w, h, objects) in enumerate(TOOL_IMAGES):
        image_id = k + cvat
        write_image(root / "images" / split / name, np.random.default_rng(k).integers(0, 255, (h, w, 3), np.uint8))
        folder = "images\\" if name == "b.jpg" else "images/"  # Label Studio on Windows joins with a backslash
        images.append({"id": image_id, "width": w, "height": h, "file_name": name if cvat else folder + name})
        if cvat:
            images[-1].update(license=0, flickr_url="", coco_url="", date_captured=0)
        for cls, bbox in objects:
            a = {"id": len(anns) + 1, "image_id": image_id, "category_id": order.index(cls) + cvat,
                 "segmentation": [], "area": bbox[2] * bbox[3], "bbox": bbox, "iscrowd": 0}
            a.update({"attributes": {"occluded": False}} if cvat else {"ignore": 0})
            anns.append(a)
        if cvat and name == "a.jpg":
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": 1, "iscrowd": 1,
                         "segmentation": {"counts": [0, 40, w * h - 40], "size": [h, w]}, "area": 40,
                         "bbox": [0, 0, 1, 40], "attributes": {"occluded": False}})
    out = root / "annotations" / f"instances_{split}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"licenses": [], "info": {}, "categories": cats, "images": images,
                               "annotations": anns}))
    return order


@pytest.mark.parametrize("tool", ["cvat", "label-studio"])
def test_coco_exports_of_annotation_tools_read_as_worked_out_by_hand(tmp_path, tool):
    """Category ids from 1 or 0 and in any order, image ids from 0, file names with a folder, a crowd mask left out,
    an image without annotations kept as a background, a box outside its image skipping that image only."""
    order = [tool_export(tmp_path, split, tool) for split in ("train", "val")][1]
    d = check_det_dataset(tmp_path)
    assert d["names"] == dict(enumerate(order))
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    got = {name: sorted((order[int(c)], *b) for c, b in zip(lb["cls"].reshape(-1), lb["bboxes"].tolist()))
           for name, lb in records(ds).items()}
    assert sorted(got) == sorted(BY_HAND)
    for name, rows in BY_HAND.items():
        assert [r[0] for r in got[name]] == [r[0] for r in rows]
        np.testing.assert_allclose(np.reshape([r[1:] for r in got[name]], (-1, 4)),
                                   np.reshape([r[1:] for r in rows], (-1, 4)), atol=1e-6)
    crowd = tool == "cvat"
    assert {k: ds.stats[k] for k in ("images", "backgrounds", "skipped", "left_out")} == {
        "images": 3, "backgrounds": 1, "skipped": 1, "left_out": crowd}
    problems = _problems(ds)
    assert f"d.jpg: skipped, {tmp_path / 'annotations' / 'instances_val.json'} annotation {4 + crowd}: " \
           "box corners outside [0, 1] (0.104..1.41 of the image)" in problems  # its id: after a.jpg's crowd mask
    assert ("a.jpg: kept, 1 crowd annotations left out" in problems) == crowd


def test_training_on_a_cvat_export_names_what_it_left_out(tmp_path):
    """`train.py --data <folder>` of a CVAT COCO export (annotations/instances_<subset>.json, images/<subset>/):
    trained from the JSON under its category names, and data_problems.txt names the skipped image with the file and
    the annotation, and the crowd mask left out, in each split."""
    import train

    for split in ("train", "val"):
        tool_export(tmp_path / "cvat", split, "cvat")
    trainer, _ = train.main(train.parse_opt([
        "--data", str(tmp_path / "cvat"), "--cfg", "yolov8n.yaml", "--imgsz", "64", "--batch-size", "4",
        "--epochs", "1", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"), "--noplots"]))
    assert trainer.names == {0: "person", 1: "car"}
    problems = (trainer.save_dir / "data_problems.txt").read_text().splitlines()
    expected = []
    for split in ("train", "val"):
        images, json_file = tmp_path / "cvat" / "images" / split, tmp_path / "cvat" / "annotations"
        expected += [f"{split}: {images / 'd.jpg'}: skipped, {json_file / f'instances_{split}.json'} "
                     "annotation 5: box corners outside [0, 1]",
                     f"{split}: {images / 'a.jpg'}: kept, 1 crowd annotations left out"]
    assert len(problems) == 4 and all(any(p.startswith(e) for p in problems) for e in expected), problems


def test_coco_files_with_less_or_odd_content(tmp_path, yolo_log):
    """A file listing no image sizes, or 0, trusts the images'; two categories of one name are one error naming the file
    (classes are matched by name); a file that is not JSON is one error too; no listed image at all is named."""
    root = tmp_path / "coco"
    names = dict(enumerate(CLASS_NAMES))
    coco_split(root, "a", 2, seed=13, edit=lambda d: [d["images"][0].pop(k) for k in ("width", "height")] + [
        d["images"][1].update(width=0, height=0)])
    assert YOLODataset(str(root / "a"), imgsz=64, nc=3, names=names).stats["images"] == 2
    coco_split(root, "b", 1, seed=13, edit=lambda d: d["categories"].append({"id": 50, "name": "circle"}))
    with pytest.raises(BadDataset, match=r"instances_b\.json: two categories share a name"):
        YOLODataset(str(root / "b"), imgsz=64, nc=3, names=names)
    coco_split(root, "c", 1, seed=13)
    (root / "annotations" / "instances_c.json").write_text("{not json")
    with pytest.raises(BadDataset, match=r"instances_c\.json: not a readable COCO JSON file"):
        YOLODataset(str(root / "c"), imgsz=64, nc=3, names=names)
    coco_split(root, "d", 2, seed=13, edit=lambda d: d["images"].clear())
    ds = YOLODataset(str(root / "d"), imgsz=64, nc=3, names=names)
    assert ds.stats["backgrounds"] == 2 and any("labels none of the 2 images" in m for m in yolo_log)


def test_voc_ids_without_an_image_are_named(tmp_path):
    root = tmp_path / "voc"
    voc_dataset(root, {"train": 2, "val": 2}, seed=14)
    with open(root / "ImageSets" / "Main" / "val.txt", "a") as f:
        f.write("../../etc/passwd\nval_999 1\n")  # an id is looked up among JPEGImages' files only
    d = check_det_dataset(root)
    ds = YOLODataset(d["val"], imgsz=64, nc=d["nc"], names=d["names"])
    assert ds.stats["images"] + ds.stats["skipped"] == 2 and ds.stats["ignored"] == 2
    assert any(p.endswith("val.txt: val_999: ignored, no image val_999.* in " + str(root / "JPEGImages"))
               for p in ds.problems)


def test_a_voc_file_is_read_as_a_label_file_is(tmp_path):
    """Entities declared in UTF-16 (a search of the bytes for '<!DOCTYPE' missed them, and expat expanded them up to
    its amplification limit), 64 MiB of apparent size (read whole), a FIFO (blocked the reader until someone wrote to
    it): each refused by name, nothing read past the label budget."""
    import contextlib
    import os
    import threading

    from data.annotations import read_voc_xml
    from data.label_formats import BadLine

    laughs = tmp_path / "utf16.xml"
    laughs.write_bytes('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE a [<!ENTITY l "lol">]><annotation>&l;'
                       '</annotation>'.encode("utf-16"))
    with pytest.raises(BadLine, match="declares a DOCTYPE or entities"):
        read_voc_xml(laughs)
    big = tmp_path / "big.xml"
    with open(big, "wb") as f:
        f.write(b"<annotation>")
        f.truncate(64 << 20)
    with pytest.raises(BadLine, match="larger than 4194304 bytes"):
        read_voc_xml(big)
    fifo = tmp_path / "fifo.xml"
    os.mkfifo(fifo)
    # a reader that opens it gets a valid file from this writer instead of blocking (so a regression fails, not hangs)
    def write():
        with contextlib.suppress(BrokenPipeError):  # the test's own reader below, which closes at once
            fifo.write_bytes(b"<annotation/>")
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        with pytest.raises(BadLine, match="is not a regular file"):
            read_voc_xml(fifo)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go when nothing read
        writer.join(10)
