"""Every entry a dataset scan meets is used, skipped with a reason or listed as ignored: the set-up mistakes beyond
the fault corpus (hidden and loose entries in a classification split, repeated and non-UTF-8 list entries, label
files in the wrong folder)."""

import os
import shutil

from data.classify_dataset import ClassificationDataset
from data.dataset_yaml import check_cls_dataset
from data.detect_dataset import YOLODataset
from data.image_files import disk_cache_path, scan_files


def test_hidden_folders_and_loose_files_in_a_classification_split(shapes_cls, tmp_path):
    root = tmp_path / "cls"
    shutil.copytree(shapes_cls, root)
    shutil.copytree(root / "train" / "circle", root / "train" / ".ipynb_checkpoints")  # a notebook's copies
    shutil.copy(root / "train" / "circle" / "00000.jpg", root / "train" / "stray.jpg")
    assert check_cls_dataset(root)["names"] == {0: "circle", 1: "rectangle", 2: "triangle"}
    ds = ClassificationDataset(root / "train", imgsz=32)
    assert ds.names == {0: "circle", 1: "rectangle", 2: "triangle"} and len(ds) == 12
    assert ds.problems == [f"{root / 'train' / '.ipynb_checkpoints'}: ignored, a hidden folder is no class",
                           f"{root / 'train' / 'stray.jpg'}: ignored, not inside a class folder"]
    assert ds.stats["ignored"] == 2


def test_repeated_and_non_utf8_list_entries(shapes_det, tmp_path):
    root = tmp_path / "det"
    shutil.copytree(shapes_det, root, ignore=shutil.ignore_patterns("*.cache"))
    images = sorted((root / "images" / "train").iterdir())
    latin1 = os.fsencode(root / "images" / "train") + b"/caf\xe9.jpg"
    os.rename(images[0], latin1)
    os.rename(root / "labels" / "train" / "00000.txt", os.fsencode(root / "labels" / "train") + b"/caf\xe9.txt")
    listed = [latin1, os.fsencode(images[1]), os.fsencode(images[1]), os.fsencode(images[2])]
    (root / "train.txt").write_bytes(b"\n".join(listed) + b"\n")
    ds = YOLODataset(str(root / "train.txt"), imgsz=64, nc=3)
    assert ds.im_files == [os.fsdecode(latin1), str(images[1]), str(images[2])]
    assert ds.problems == [f"{images[1]}: ignored, a repeated entry (used once)"]
    assert (ds.stats["images"], ds.stats["ignored"]) == (3, 1)


def test_label_files_in_the_wrong_folder_are_one_warning(shapes_det, tmp_path, yolo_log):
    root = tmp_path / "det"
    shutil.copytree(shapes_det, root, ignore=shutil.ignore_patterns("*.cache"))
    for lb in (root / "labels" / "train").iterdir():
        lb.rename(root / "images" / "train" / lb.name)  # beside the images: not where the rule looks
    ds = YOLODataset(str(root / "images" / "train"), imgsz=64, nc=3)
    n = len(ds)
    assert ds.stats["backgrounds"] == ds.stats["unlabelled"] == n == 16 and ds.stats["ignored"] == 16
    warning = [m for m in yolo_log if "has a label file" in m]
    assert warning == [f"WARNING: not one of the 16 images has a label file (e.g. "
                       f"{root / 'labels' / 'train' / '00000.txt'} for {root / 'images' / 'train' / '00000.jpg'}: "
                       "the last /images/ of an image path becomes /labels/ and its suffix .txt); every image is "
                       "trained as a background"]


def test_only_the_disk_caches_of_listed_images_go_unmentioned(tmp_path):
    """x.jpg.yolo-engine.npy is this project's --cache disk copy of x.jpg; x.npy (a depth map, or the official repos'
    cache, which this project never reads) is listed like any other file that is not an image."""
    (tmp_path / "x.jpg").write_bytes(b"")
    for f in (disk_cache_path(tmp_path / "x.jpg"), tmp_path / "x.npy", disk_cache_path(tmp_path / "gone.jpg")):
        f.write_bytes(b"")
    files, others = scan_files(tmp_path)
    assert files == [str(tmp_path / "x.jpg")]
    assert sorted(others) == [(str(tmp_path / "gone.jpg.yolo-engine.npy"), "suffix '.npy' is not an image format"),
                              (str(tmp_path / "x.npy"), "suffix '.npy' is not an image format")]


def test_a_recursive_glob_enters_each_real_folder_once(tmp_path):
    """A folder linking to itself: glob.glob's `**` followed the link until path resolution gave up (41 paths for the
    one image here; two such links make 2^depth paths, a scan that never ends). Each real folder is entered once, as
    a folder scan does; the glob keeps glob's rules (wildcards skip hidden names, `[!...]` negates)."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "loop").symlink_to(".")
    for name in ("x.jpg", "sub/y.jpg", "sub/.hidden.jpg", "sub/[q].jpg"):
        (d / name).touch()
    assert scan_files(f"{d}/**/*.jpg")[0] == [str(d / "sub" / "[q].jpg"), str(d / "sub" / "y.jpg"), str(d / "x.jpg")]
    assert scan_files(f"{d}/**/[!x].jpg")[0] == [str(d / "sub" / "y.jpg")]
    assert scan_files(f"{d}/*/[[]q].jpg")[0] == [str(d / "sub" / "[q].jpg")]


def test_a_darknet_list_reads_its_data_prefix_as_the_lists_folder(tmp_path):
    """CVAT's YOLO 1.1 export: train.txt beside obj_train_data/ lists `data/obj_train_data/x.jpg` (darknet reads it
    from its own folder, the export being its data/): each entry is found without the prefix; an entry under a real
    data/ folder beside the list stays as written."""
    root = tmp_path / "export"
    for rel in ("obj_train_data/a.jpg", "obj_train_data/b.jpg", "data/c.jpg"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    (root / "train.txt").write_text("data/obj_train_data/a.jpg\ndata/obj_train_data/b.jpg\ndata/c.jpg\n"
                                    "data/obj_train_data/gone.jpg\n")
    files, others = scan_files(str(root / "train.txt"))
    assert files == [str(root / "obj_train_data" / "a.jpg"), str(root / "obj_train_data" / "b.jpg"),
                     str(root / "data" / "c.jpg"), str(root / "data" / "obj_train_data" / "gone.jpg")]
    assert others == []


def test_a_list_entry_found_only_from_the_working_folder_is_read_from_there(tmp_path, monkeypatch):
    """`--source list.txt` naming files as the command line would (relative to where the command runs): an entry
    missing from the list's folder but present from the working folder is read; the list's folder comes first."""
    work, lists = tmp_path / "work", tmp_path / "lists"
    for f in (work / "images" / "a.jpg", work / "images" / "b.jpg", lists / "images" / "b.jpg"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    (lists / "list.txt").write_text("images/a.jpg\nimages/b.jpg\nimages/gone.jpg\n")
    monkeypatch.chdir(work)
    files, others = scan_files(str(lists / "list.txt"))
    assert files == [str(work / "images" / "a.jpg"), str(lists / "images" / "b.jpg"),
                     str(lists / "images" / "gone.jpg")]
    assert others == []
