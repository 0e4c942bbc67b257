"""A generated corpus of broken detection data, one fault kind per image, each with its exact expected outcome
(the policy in data/labels.verify_image_label): skipped with a reason naming the file, kept as background,
kept with a note, clipped, converted. Then one training epoch on it runs to the end and lists every skipped image
in the run folder, and a 2-epoch run on 30 % bad label files never loads one of those images."""

import csv
import io
import os
import shutil

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

import train
from data import detect_dataset
from data.detect_dataset import YOLODataset
from data.label_formats import SegmentLabels
from data.synthetic import generate_dataset

BOX = "0 0.5 0.5 0.2 0.2"


def _append(line):
    def fault(im, lb):
        lb.write_text(lb.read_text() + line + "\n")
        return im
    return fault


def _write_label(text_or_bytes):
    def fault(im, lb):
        (lb.write_bytes if isinstance(text_or_bytes, bytes) else lb.write_text)(text_or_bytes)
        return im
    return fault


def _image_bytes(data):
    def fault(im, lb):
        im.write_bytes(data)
        return im
    return fault


def _truncate(fraction):
    def fault(im, lb):
        data = im.read_bytes()
        im.write_bytes(data[: int(len(data) * fraction)])
        return im
    return fault


def _tiny(im, lb):
    cv2.imwrite(str(im), np.full((8, 8, 3), 128, np.uint8))
    return im


def _as_png(convert):
    def fault(im, lb):
        png = im.with_suffix(".png")
        cv2.imwrite(str(png), convert(cv2.imread(str(im))))
        im.unlink()
        return png
    return fault


def _exif_rotated(im, lb):
    """Stored w x h with EXIF orientation 6 (rotate 90 degrees clockwise to display): shown as h x w."""
    pil = Image.open(im)
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    pil.save(buf, "JPEG", exif=exif.tobytes(), quality=95)
    im.write_bytes(buf.getvalue())
    return im


def _missing_label(im, lb):
    lb.unlink()
    return im


def _duplicate_first(im, lb):
    first = lb.read_text().splitlines()[0]
    lb.write_text(lb.read_text() + first + "\n")
    return im


def _crlf_and_blank_lines(im, lb):
    lines = lb.read_text().splitlines()
    lb.write_bytes(("\r\n\r\n".join(f"  {x}  " for x in lines) + "\r\n\r\n").encode())
    return im


def _png_named_jpg(im, lb):
    cv2.imwrite(str(im.with_suffix(".png")), cv2.imread(str(im)))
    im.with_suffix(".png").replace(im)
    return im


def _bom(im, lb):
    lb.write_bytes(b"\xef\xbb\xbf" + lb.read_bytes())
    return im


def _label_folder(im, lb):
    lb.unlink()
    lb.mkdir()
    return im


def _label_dangling(im, lb):
    lb.unlink()
    lb.symlink_to(lb.with_name("nowhere.txt"))
    return im


def _image_dangling(im, lb):
    im.unlink()
    im.symlink_to(im.with_name("nowhere.jpg"))
    return im


def _image_loop(im, lb):
    im.unlink()
    im.symlink_to(im.name)
    return im


def _image_folder(im, lb):
    im.unlink()
    im.mkdir()
    return im


def _latin1_name(*more):
    """The image and its label renamed to Latin-1 bytes ('café'), which are not UTF-8; then `more` faults."""
    def fault(im, lb):
        stem = os.fsdecode(b"caf\xe9" + im.stem.encode())
        new_im, new_lb = im.with_name(stem + im.suffix), lb.with_name(stem + ".txt")
        im.rename(new_im)
        lb.rename(new_lb)
        for f in more:
            f(new_im, new_lb)
        return new_im
    return fault


# name -> (fault, expected): ("skip", words the reason must contain) or ("keep", what is checked on the kept image)
FAULTS = {
    "six columns": (_append(BOX + " 0.1"), ("skip", "6 values")),
    "non-numeric": (_append("0 0.5 abc 0.2 0.2"), ("skip", "non-numeric")),
    "nan": (_append("0 nan 0.5 0.2 0.2"), ("skip", "non-finite")),
    "inf": (_append("0 0.5 0.5 inf 0.2"), ("skip", "non-finite")),
    "coordinate > 1": (_append("0 0.5 1.5 0.2 0.2"), ("skip", "outside [0, 1]")),
    "negative coordinate": (_append("0 -0.3 0.5 0.2 0.2"), ("skip", "outside [0, 1]")),
    "class >= nc": (_append("3 0.5 0.5 0.2 0.2"), ("skip", "class 3 >= nc 3")),
    "negative class": (_append("-1 0.5 0.5 0.2 0.2"), ("skip", "class -1 is not a non-negative integer")),
    "fractional class": (_append("1.5 0.5 0.5 0.2 0.2"), ("skip", "class 1.5 is not a non-negative integer")),
    "zero width": (_append("0 0.5 0.5 0 0.2"), ("skip", "width or height <= 0")),
    "one-point polygon": (_append("0 0.5 0.5"), ("skip", "3 values")),
    "odd polygon": (_append("0 0.1 0.1 0.5 0.1 0.3 0.6 0.2"), ("skip", "8 values")),
    "not UTF-8": (_write_label(b"0 0.5 0.5 0.2 0.2\n\xff\xfe0 0.1\n"), ("skip", "not UTF-8")),
    "zero-byte image": (_image_bytes(b""), ("skip", "0 bytes")),
    "not an image": (_image_bytes(b"<html>404 not found</html>"), ("skip", "not a readable image")),
    "image under 10 px": (_tiny, ("skip", "8x8 is under 10 pixels")),
    "truncated beyond decoding": (_truncate(0.02), ("skip", "not a readable image")),
    "empty label file": (_write_label(""), ("keep", "background")),
    "missing label file": (_missing_label, ("keep", "background")),
    "duplicate row": (_duplicate_first, ("keep", "duplicate")),
    "box 0.4 % outside": (_append("1 1.004 0.5 0.2 0.2"), ("keep", "clipped")),
    "grey image": (_as_png(lambda im: cv2.cvtColor(im, cv2.COLOR_BGR2GRAY)), ("keep", "converted")),
    "RGBA image": (_as_png(lambda im: cv2.cvtColor(im, cv2.COLOR_BGR2BGRA)), ("keep", "converted")),
    "16-bit image": (_as_png(lambda im: im.astype(np.uint16) * 257), ("keep", "converted")),
    "EXIF-rotated image": (_exif_rotated, ("keep", "rotated")),
    "truncated but decodable JPEG": (_truncate(0.7), ("keep", "truncated")),
    "CRLF, blank lines, padding": (_crlf_and_blank_lines, ("keep", "as is")),
    "polygon line": (_append("2 0.1 0.1 0.3 0.1 0.2 0.4"), ("keep", "polygon")),
    "PNG named .jpg": (_png_named_jpg, ("keep", "as is")),
    "byte order mark": (_bom, ("keep", "as is")),
    "class with underscore": (_append("0_1 0.5 0.5 0.2 0.2"), ("skip", "value '0_1' is not a plain decimal number")),
    "class in exponent form": (_append("1e0 0.5 0.5 0.2 0.2"), ("skip", "class 1e0 is not a non-negative integer in "
                                                                        "decimal digits")),
    "zero-area polygon": (_append("0 0.1 0.1 0.5 0.5 0.9 0.9"), ("skip", "zero-area polygon")),
    "label path is a folder": (_label_folder, ("skip", ".txt is a folder, not a file")),
    "label path is a dangling symlink": (_label_dangling, ("skip", ".txt is a dangling symlink")),
    "image is a dangling symlink": (_image_dangling, ("skip", "image path is a dangling symlink")),
    "image is a symlink loop": (_image_loop, ("skip", "image path is a symlink loop")),
    "image is a folder": (_image_folder, ("skip", "image path is a folder, not a file")),
    "Latin-1 file name": (_latin1_name(), ("keep", "as is")),
    "Latin-1 file name, bad line": (_latin1_name(_append("5 0.5 0.5 0.2 0.2")), ("skip", "class 5 >= nc 3")),
}
N_CLEAN = 4


def _read_boxes(lb):
    rows = [r.split() for r in lb.read_text().splitlines() if r.strip()] if lb.is_file() else []
    return [[float(v) for v in r] for r in rows]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(dataset root, {image name: (fault name, expected, original label rows, original (h, w))})."""
    root = generate_dataset(tmp_path_factory.mktemp("faults") / "data", "detect", len(FAULTS) + N_CLEAN, 2, seed=4,
                            min_side=64, max_side=80, max_objects=2)
    cases = {}
    for i, (name, (fault, expected)) in enumerate(FAULTS.items()):
        im, lb = root / "images" / "train" / f"{i:05d}.jpg", root / "labels" / "train" / f"{i:05d}.txt"
        if not _read_boxes(lb):  # every fault image starts with at least one object
            lb.write_text("1 0.3 0.3 0.2 0.2\n")
        rows, hw = _read_boxes(lb), cv2.imread(str(im)).shape[:2]
        cases[fault(im, lb).name] = (name, expected, rows, hw)
    (root / "images" / "train" / "notes.txt").write_text("not an image\n")  # listed as ignored, not an image
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                    "names": ["circle", "rectangle", "triangle"]}))
    return root, cases


def test_every_fault_has_its_exact_outcome(corpus, yolo_log):
    root, cases = corpus
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, nc=3)
    kept = {os.path.basename(lb["im_file"]): lb for lb in ds.labels}
    skipped = [n for n, (_, exp, _, _) in cases.items() if exp[0] == "skip"]
    clean = [f"{i:05d}.jpg" for i in range(len(FAULTS), len(FAULTS) + N_CLEAN)]
    assert sorted(kept) == sorted(set(cases) - set(skipped) | set(clean))
    for image, (name, (outcome, what), rows, (h, w)) in cases.items():
        notes = [m for m in ds.problems if m.startswith(str(root / "images" / "train" / image) + ":")]
        if outcome == "skip":
            assert len(notes) == 1 and ": skipped, " in notes[0] and what in notes[0], (name, notes)
            continue
        lb = kept[image]
        cls = lb["cls"].ravel().tolist()
        if what == "background":
            assert cls == [] and notes == [], name
        elif what == "duplicate":
            assert cls == [r[0] for r in rows] and "duplicate row" in notes[0], name
        elif what == "clipped":
            assert cls == [r[0] for r in rows] + [1.0], name
            np.testing.assert_allclose(lb["bboxes"][-1], [0.952, 0.5, 0.096, 0.2], atol=1e-6)
        elif what == "polygon":
            assert cls == [r[0] for r in rows] + [2.0], name
            np.testing.assert_allclose(lb["bboxes"][-1], [0.2, 0.25, 0.2, 0.3], atol=1e-6)
        elif what == "truncated":
            assert cls == [r[0] for r in rows] and "truncated JPEG, kept" in notes[0], name
        else:  # as is, converted or rotated: same labels, 8-bit 3-channel, upright size
            assert cls == [r[0] for r in rows] and notes == [], name
            np.testing.assert_allclose(lb["bboxes"], np.array(rows)[:, 1:], atol=1e-6)
            assert lb["shape"] == ((w, h) if what == "rotated" else (h, w)), name
            assert ds.load_image(ds.im_files.index(lb["im_file"]))[0].dtype == np.uint8
    notes_txt = root / "images" / "train" / "notes.txt"
    assert ds.problems[-1] == f"{notes_txt}: ignored, suffix '.txt' is not an image format"
    s = ds.stats
    assert s["ignored"] == 1
    n_empty_clean = sum(not _read_boxes(root / "labels" / "train" / c.replace(".jpg", ".txt")) for c in clean)
    assert (s["images"], s["skipped"]) == (len(kept), len(skipped)) and len(skipped) >= 15
    assert (s["backgrounds"], s["duplicates"], s["clipped"], s["truncated"]) == (2 + n_empty_clean, 1, 1, 1)
    summary = next(m for m in yolo_log if "Scanning" in m)
    assert f"{len(kept)} images ({2 + n_empty_clean} backgrounds), {len(skipped)} skipped" in summary
    assert any(f"{len(skipped)} images skipped" in m for m in yolo_log)


def test_segment_polygon_rules(tmp_path):
    root = generate_dataset(tmp_path / "seg", "segment", 3, 1, seed=0, min_side=64, max_side=64, max_objects=2)
    lb = root / "labels" / "train" / "00000.txt"
    lb.write_text(lb.read_text() + "1 0.2 0.2 0.4 0.4\n")  # two points: 5 values read as a box, kept with its outline
    bad = root / "labels" / "train" / "00001.txt"
    bad.write_text(bad.read_text() + "1 0.2 0.2\n")  # one point
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, nc=3, task=SegmentLabels())
    assert [os.path.basename(f) for f in ds.im_files] == ["00000.jpg", "00002.jpg"]
    assert all(s.shape[0] >= 3 for lb in ds.labels for s in lb["segments"])
    assert "00001.txt line" in ds.problems[0] and "3 values" in ds.problems[0]


def test_training_on_the_corpus_runs_to_the_end(corpus, tmp_path):
    root, cases = corpus
    data = tmp_path / "data"
    shutil.copytree(root, data, symlinks=True, ignore=shutil.ignore_patterns("*.cache"))
    (data / "data.yaml").write_text((root / "data.yaml").read_text().replace(str(root), str(data)))
    trainer, _ = train.main(train.parse_opt([
        "--data", str(data / "data.yaml"), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "8",
        "--epochs", "1", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"),
        "--skip-unknown-classes"]))  # the corpus's class ids beyond names are skipped as its other faults are
    assert len(list(csv.DictReader(open(trainer.save_dir / "results.csv")))) == 1
    listed = (trainer.save_dir / "data_problems.txt").read_text(errors="surrogateescape").splitlines()
    for image, (name, (outcome, _), _, _) in cases.items():
        hits = [x for x in listed if x.startswith(f"train: {data / 'images' / 'train' / image}: ")]
        assert len(hits) == (1 if outcome == "skip" or name in ("duplicate row", "truncated but decodable JPEG")
                             else 0), name


def test_images_with_a_bad_line_never_reach_a_batch(tmp_path, monkeypatch):
    root = generate_dataset(tmp_path / "data", "detect", 10, 2, seed=7, min_side=64, max_side=80, max_objects=2)
    bad = [1, 4, 8]  # 30 % of the label files get one bad line among good ones
    for i, line in zip(bad, ("0 0.5 0.5 0.2 0.2 0.3", "2 0.5 0.5 1.2 0.2", "4 0.5 0.5 0.2 0.2")):
        (root / "labels" / "train" / f"{i:05d}.txt").write_text("1 0.3 0.3 0.2 0.2\n" + line + "\n0 0.6 0.6 0.1 0.1\n")
    train_images = {str(root / "images" / "train" / f"{i:05d}.jpg") for i in range(10)}
    bad_images = {str(root / "images" / "train" / f"{i:05d}.jpg") for i in bad}
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                    "names": ["circle", "rectangle", "triangle"]}))
    loaded = []
    real = detect_dataset.YOLODataset.load_image

    def spy(self, i):  # every image a batch is made of passes here, mosaic partners included
        loaded.append(self.im_files[i])
        return real(self, i)

    monkeypatch.setattr(detect_dataset.YOLODataset, "load_image", spy)
    trainer, _ = train.main(train.parse_opt([
        "--data", str(root / "data.yaml"), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "4",
        "--epochs", "2", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"),
        "--skip-unknown-classes"]))  # the class 4 line: skipped, not refused
    assert len(list(csv.DictReader(open(trainer.save_dir / "results.csv")))) == 2
    assert set(loaded) & train_images == train_images - bad_images  # every good image was used, no bad one
    assert len(trainer.train_set) == 7


def test_an_image_deleted_during_training_is_replaced_with_a_warning(det_copy, yolo_log):
    ds = YOLODataset(str(det_copy / "images" / "train"), imgsz=64, augment=True, nc=3)
    gone = ds.im_files[3]
    os.remove(gone)
    samples = [ds[i] for i in range(len(ds))]  # mosaic: the lost image is also drawn as a partner
    assert len(samples) == len(ds) and gone not in [s["path"] for s in samples]
    warnings = [m for m in yolo_log if gone in m]
    assert len(warnings) == 1 and "missing or unreadable since the scan, skipped" in warnings[0]


@pytest.mark.parametrize("group", [[3, 5], [3]])
def test_a_group_holding_a_deleted_image_still_loads(det_copy, yolo_log, group):
    """The training loader's groups draw partners among their own images: a group of two with one gone, and a group
    of only the lost image (an epoch's last group), must still give every sample, read the lost file once, and
    substitute from what is left (the share, when the group has nothing left)."""
    ds = YOLODataset(str(det_copy / "images" / "train"), imgsz=64, augment=True, hyp=dict(mosaic=1.0, mixup=0.5),
                     nc=3)
    gone = ds.im_files[3]
    os.remove(gone)
    reads = []
    real = ds.load_image
    ds.load_image = lambda i: reads.append(i) or real(i)
    for epoch in range(20):
        ds.rng.set_epoch(epoch)
        reads.clear()
        samples = ds.__getitems__(group)
        assert len(samples) == len(group) and gone not in [s["path"] for s in samples]
        assert reads.count(3) == 1  # a lost image is tried once per group
    assert len([m for m in yolo_log if gone in m]) == 1


def test_a_class_folder_without_readable_images_is_named(shapes_cls, tmp_path):
    from data.classify_dataset import ClassificationDataset

    root = tmp_path / "cls"
    shutil.copytree(shapes_cls, root)
    for f in (root / "train" / "triangle").iterdir():
        f.write_bytes(b"")
    ds = ClassificationDataset(root / "train", imgsz=32)
    assert ds.stats["empty_classes"] == 1 and ds.stats["skipped"] == 4 and ds.names[2] == "triangle"
    assert ds.problems[0] == f"{root / 'train' / 'triangle'}: skipped, class folder has no readable image"
    assert {c for _, c in ds.samples} == {0, 1}


def test_val_script_lists_the_skipped_val_images_in_its_run_folder(tmp_path):
    import torch

    import val
    from models.checkpoints import model_to_ckpt
    from models.yolo import DetectionModel

    root = generate_dataset(tmp_path / "data", "detect", 2, 4, seed=1, min_side=64, max_side=80, max_objects=2)
    bad = root / "labels" / "val" / "00003.txt"
    bad.write_text("1 0.3 0.3 0.2 0.2\n7 0.5 0.5 0.2 0.2\n")  # class 7 of 3: the image is skipped whole
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                    "names": ["circle", "rectangle", "triangle"]}))
    weights = tmp_path / "v5n.pt"
    torch.save({"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=3))}, weights)
    val.main(val.parse_opt(["--weights", str(weights), "--data", str(root / "data.yaml"), "--imgsz", "64",
                            "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "runs"), "--name", "v",
                            "--skip-unknown-classes"]))
    listed = (tmp_path / "runs" / "v" / "data_problems.txt").read_text().splitlines()
    assert len(listed) == 1 and listed[0].startswith(f"val: {root / 'images' / 'val' / '00003.jpg'}: skipped")
