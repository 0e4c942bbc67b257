"""Several processes preparing the same path at the same instant (as several nodes on one shared filesystem do):
synthetic generation, a `download:` archive (a local file URL), an official weights download, the label cache and
`--cache disk` files. Each ends with one complete result, no error, and no temporary file left behind.

Generation goes through the dataset YAML's `synthetic:` entry, the path several nodes take when they start on a
dataset none of them has yet. Four processes are started once (spawn: the way separate nodes share nothing in
memory) and run every scenario in turn, meeting at a barrier before each so that they really start it together.
"""

import multiprocessing as mp
import os
import shutil
import traceback
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from data.image_files import disk_cache_path
from utils.files import publish

N = 4
SCENARIOS = ("generate", "download", "weights", "label_cache", "cache_disk")
SYNTH = {"task": "detect", "n_train": 6, "n_val": 2, "seed": 3, "min_side": 64, "max_side": 96}


def _scenario(name, root):
    """One process's part of scenario `name`; returns a picklable summary of what it saw."""
    if name == "generate":
        from data.dataset_yaml import check_det_dataset

        check_det_dataset(str(root / "gen.yaml"))
        return sorted(p.name for p in (root / "gen" / "shapes" / "images" / "train").iterdir())
    if name == "download":
        from data.downloads import download

        download((root / "src" / "pack.zip").as_uri(), dir=root / "dl")
        return _listing(root / "dl")
    if name == "weights":
        from models.checkpoints import releases as mc

        mc.official_url = lambda name: (root / "src" / "yolov5s.pt").as_uri()  # no network: a local release
        return str(mc.attempt_download("yolov5s.pt", root / "weights"))
    from data.detect_dataset import YOLODataset

    data = root / "data" / "images" / "train"
    ds = YOLODataset(str(data), imgsz=64, nc=3, cache="disk" if name == "cache_disk" else None)
    return [(lb["im_file"], lb["cls"].tolist(), lb["bboxes"].tolist()) for lb in ds.labels]


def _listing(folder):
    """Every path under `folder`, relative to it. os.walk, unlike rglob, passes over the temporary folders that
    other processes still at work remove while this one lists."""
    return sorted(str((Path(d) / n).relative_to(folder)) for d, dirs, files in os.walk(folder) for n in dirs + files)


def _worker(root, barrier, queue):
    for name in SCENARIOS:
        barrier.wait(timeout=120)
        try:
            queue.put((name, "ok", _scenario(name, root)))
        except Exception:
            queue.put((name, "error", traceback.format_exc()))


@pytest.fixture(scope="module")
def race(tmp_path_factory):
    """{scenario: [result of each process]} after N processes ran every scenario together."""
    from data.synthetic import generate_dataset

    root = tmp_path_factory.mktemp("race")
    src = root / "src"
    generate_dataset(src / "pack" / "part", **SYNTH)  # archive content for the download scenario
    shutil.make_archive(str(src / "pack"), "zip", src / "pack")
    (src / "yolov5s.pt").write_bytes(np.random.default_rng(0).bytes(300_000))
    generate_dataset(root / "data", **SYNTH)  # a dataset without label cache or .npy files
    generate_dataset(root / "reference", **SYNTH)  # what one process alone writes
    names = {0: "circle", 1: "rectangle", 2: "triangle"}
    (root / "gen.yaml").write_text(yaml.safe_dump({"path": str(root / "gen" / "shapes"), "train": "images/train",
                                                   "val": "images/val", "names": names, "synthetic": SYNTH}))
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(N), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(root, barrier, queue)) for _ in range(N)]
    for p in procs:
        p.start()
    results = {name: [] for name in SCENARIOS}
    try:
        for _ in range(N * len(SCENARIOS)):
            name, status, value = queue.get(timeout=240)
            results[name].append((status, value))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return root, results


def _all_ok(results):
    errors = [v for status, v in results if status != "ok"]
    assert not errors, errors[0]
    assert len(results) == N
    return [v for _, v in results]


def _no_temporaries(folder):
    left = [str(p) for p in Path(folder).rglob(".*")]
    assert not left, f"temporary files left behind: {left[:5]}"


def test_generation_race_ends_with_one_complete_dataset(race):
    root, results = race
    listings = _all_ok(results["generate"])
    assert all(x == listings[0] for x in listings) and len(listings[0]) == SYNTH["n_train"]
    assert [p.name for p in (root / "gen").iterdir()] == ["shapes"]  # one copy, no temporary sibling
    ref, got = root / "reference", root / "gen" / "shapes"
    files = sorted(p.relative_to(ref) for p in ref.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(got) for p in got.rglob("*") if p.is_file())
    assert all((ref / f).read_bytes() == (got / f).read_bytes() for f in files)


def test_download_race_ends_with_one_unpacked_copy(race):
    root, results = race
    listings = _all_ok(results["download"])
    with zipfile.ZipFile(root / "src" / "pack.zip") as z:
        files = [m for m in z.namelist() if not m.endswith("/")]
        for m in files:
            assert (root / "dl" / m).read_bytes() == z.read(m), m
    assert all(set(files) <= set(seen) for seen in listings)  # complete for every process when it returned
    assert sorted(str(p.relative_to(root / "dl")) for p in (root / "dl").rglob("*") if p.is_file()) == sorted(files)
    _no_temporaries(root / "dl")  # and the archive itself is gone (unpacked, then deleted)


def test_weights_download_race(race):
    root, results = race
    paths = _all_ok(results["weights"])
    assert set(paths) == {str(root / "weights" / "yolov5s.pt")}
    assert (root / "weights" / "yolov5s.pt").read_bytes() == (root / "src" / "yolov5s.pt").read_bytes()
    _no_temporaries(root / "weights")


def test_label_cache_race(race):
    from data.image_files import files_hash, img2label_paths, scan_files
    from data.label_cache import load_cache
    from data.label_formats import DetectLabels
    from data.labels import CACHE_VERSION

    root, results = race
    labels = _all_ok(results["label_cache"])
    assert all(x == labels[0] for x in labels) and len(labels[0]) == SYNTH["n_train"]
    for im_file, cls, boxes in labels[0]:  # the labels are the files' own lines
        lines = Path(img2label_paths([im_file])[0]).read_text().split("\n")
        rows = np.array([[float(v) for v in ln.split()] for ln in lines if ln.strip()], np.float32)
        np.testing.assert_array_equal(np.array(cls, np.float32)[:, 0], rows[:, 0])
        np.testing.assert_allclose(np.array(boxes, np.float32), rows[:, 1:], atol=2e-6)
    ims = scan_files(str(root / "data" / "images" / "train"))[0]
    hash_ = files_hash(ims + img2label_paths(ims), extra=f"{CACHE_VERSION} nc=3 {DetectLabels.line_format}")
    cache = root / "data" / "labels" / "train.yolo-engine.cache"
    assert load_cache(cache, hash_) is not None  # one complete, current cache
    _no_temporaries(root / "data")


def test_cache_disk_race(race):
    root, results = race
    _all_ok(results["cache_disk"])
    images = sorted((root / "data" / "images" / "train").glob("*.jpg"))
    for im in images:
        np.testing.assert_array_equal(np.load(disk_cache_path(im)), cv2.imread(str(im)))
    _no_temporaries(root / "data")


def test_publish_leaves_nothing_when_the_build_fails(tmp_path):
    def broken(tmp):
        Path(tmp).mkdir()
        (Path(tmp) / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(tmp_path / "out", broken)
    assert list(tmp_path.iterdir()) == []
    assert publish(tmp_path / "f.txt", lambda t: Path(t).write_text("1"))
    assert not publish(tmp_path / "f.txt", lambda t: Path(t).write_text("2"))  # published: used as it is
    assert (tmp_path / "f.txt").read_text() == "1"
    assert publish(tmp_path / "f.txt", lambda t: Path(t).write_text("3"), replace=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"] and (tmp_path / "f.txt").read_text() == "3"


def _one_zip(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with zipfile.ZipFile(src / "pack.zip", "w") as z:
        z.writestr("part/a.txt", "0 0.5 0.5 0.1 0.1\n")
    return (src / "pack.zip").as_uri()


def test_an_archive_fetched_anew_during_a_racing_unpack_is_unpacked(tmp_path, monkeypatch):
    """The race test's failure under load: process A unpacks and deletes the archive while B reads its size, and C
    fetches it anew meanwhile, so the archive is there again when B looks: B unpacks that copy."""
    from data import downloads

    real, calls = downloads._unpack_into, []

    def vanished_once(archive, dir, within):
        calls.append(archive)
        if len(calls) == 1:
            raise FileNotFoundError(archive)  # the archive still exists: another process fetched it again
        return real(archive, dir, within)

    monkeypatch.setattr(downloads, "_unpack_into", vanished_once)
    downloads.download(_one_zip(tmp_path), dir=tmp_path / "dl")
    assert len(calls) == 2 and (tmp_path / "dl" / "part" / "a.txt").read_text().startswith("0 ")
    assert not (tmp_path / "dl" / "pack.zip").exists()


def test_an_archive_another_process_unpacked_and_deleted_is_not_unpacked_again(tmp_path, monkeypatch):
    from data import downloads

    calls = []

    def deleted_by_another(archive, dir, within):
        calls.append(archive)
        archive.unlink()  # the other process finished: it unpacked the content and deleted the archive
        raise FileNotFoundError(archive)

    monkeypatch.setattr(downloads, "_unpack_into", deleted_by_another)
    downloads.download(_one_zip(tmp_path), dir=tmp_path / "dl")
    assert len(calls) == 1


def test_an_archive_that_keeps_vanishing_is_an_error(tmp_path, monkeypatch):
    from data import downloads

    def always(archive, dir, within):
        raise FileNotFoundError(archive)

    monkeypatch.setattr(downloads, "_unpack_into", always)
    with pytest.raises(FileNotFoundError):
        downloads.download(_one_zip(tmp_path), dir=tmp_path / "dl")
