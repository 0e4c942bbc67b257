"""The label cache (data/label_cache.py): a format that cannot run code, rebuilt with one warning when it is
corrupt, foreign or of another version, never written by a rank other than local rank 0, and a read-only dataset
folder costs one warning, never a crash."""

import json
import os
import subprocess
import tracemalloc

import numpy as np
import pytest

import train
from data import label_cache
from data.detect_dataset import YOLODataset
from data.label_cache import load_cache, save_cache


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_round_trip_keeps_arrays_tuples_and_nesting(tmp_path):
    rng = np.random.default_rng(0)
    data = {"labels": [{"im_file": "a.jpg", "shape": (96, 128), "cls": rng.random((3, 1)).astype(np.float32),
                        "bboxes": rng.random((3, 4)).astype(np.float32), "segments": [None, rng.random((5, 2)), None]}],
            "stats": {"images": 1, "corrupt": 0}, "msgs": ["x: bad line"], "good": [0, 2], "empty": np.zeros((0, 4))}
    assert save_cache(tmp_path / "t.cache", data, "h1")
    back = load_cache(tmp_path / "t.cache", "h1")
    lb, ref = back["labels"][0], data["labels"][0]
    assert lb["shape"] == (96, 128) and isinstance(lb["shape"], tuple)
    for k in ("cls", "bboxes"):
        assert lb[k].dtype == ref[k].dtype and lb[k].flags.writeable
        np.testing.assert_array_equal(lb[k], ref[k])
    assert lb["segments"][0] is None and lb["segments"][1].dtype == np.float64
    np.testing.assert_array_equal(lb["segments"][1], ref["segments"][1])
    assert back["stats"] == data["stats"] and back["msgs"] == data["msgs"] and back["empty"].shape == (0, 4)
    assert load_cache(tmp_path / "t.cache", "other files") is None  # the files changed: rebuilt, no warning
    assert json.loads((tmp_path / "t.cache").read_bytes().split(b"\n")[1])["version"] == label_cache.VERSION


def test_arrays_are_streamed_and_read_into_their_own_memory(tmp_path, monkeypatch):
    """The writer streams each array's bytes in blocks after the JSON line, in order (a: 28 bytes, b: 120), and the
    reader reads them straight into the arrays it returns: a file whose arrays are 40 MB costs the reader about
    40 MB of Python memory, where the text with base64 arrays cost four times that."""
    monkeypatch.setattr(label_cache, "BLOCK", 5)
    rng = np.random.default_rng(0)
    data = {"a": rng.random(7).astype(np.float32), "b": [rng.integers(0, 9, (3, 5)), (1, "x", None, 2.5, True)],
            "c": np.zeros((0, 2), np.float32), "d": np.arange(6, dtype=np.int64)[::2], "e": {"f": "é \n \""},
            "big": np.ones((10_000_000,), np.float32)}
    assert save_cache(tmp_path / "t.cache", data, "h1")
    header = (tmp_path / "t.cache").read_bytes().split(b"\n")[1]
    assert len(header) < 1000 and json.loads(header)["data"]["c"] == {"__ndarray__": ["<f4", [0, 2], 148]}
    tracemalloc.start()
    back = load_cache(tmp_path / "t.cache", "h1")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1.2 * data["big"].nbytes
    for k in ("a", "c", "d", "big"):
        assert back[k].dtype == data[k].dtype and back[k].shape == data[k].shape and back[k].flags.writeable
        np.testing.assert_array_equal(back[k], data[k])
    np.testing.assert_array_equal(back["b"][0], data["b"][0])
    assert back["b"][1] == data["b"][1] and back["e"] == data["e"]


def _signed_with_arrays(path, doc_text, tail=b""):
    """A cache file of a JSON line and raw bytes after it, signed with this user's key (a hand-made cache)."""
    body = doc_text.encode() + b"\n" + tail
    path.write_bytes(label_cache._mac(label_cache.cache_key(), body).encode() + b"\n" + body)


@pytest.mark.parametrize("entry, why", [
    ('["<f4", [4], 8]', "runs past the end"),
    ('["<f4", [1000000000000], 0]', "runs past the end"),
    ('["<f4", [-1], 0]', "whole numbers"),
    ('["<f4", [2], 1.5]', "whole numbers"),
    ('["|O", [1], 0]', "not allowed"),
    ('["<f4", 2, 0]', "ignoring label cache"),
    ('["<f4", [2]]', "ignoring label cache"),
])
def test_a_signed_cache_with_arrays_out_of_place_is_refused(tmp_path, yolo_log, entry, why):
    """Even under this user's key, an array entry that does not fit the file is a corrupt cache (one warning),
    never an allocation of what it claims."""
    doc = {"format": label_cache.FORMAT, "version": label_cache.VERSION, "hash": "h", "data": {"a": "ENTRY"}}
    _signed_with_arrays(tmp_path / "t.cache", json.dumps(doc).replace('"ENTRY"', '{"__ndarray__": ' + entry + '}'),
                        b"\x00" * 16)
    assert load_cache(tmp_path / "t.cache", "h") is None
    assert [m for m in yolo_log if "ignoring label cache" in m and why in m]


def signed(text):
    """`text` as save_cache writes a document without arrays: its MAC under this user's key, a newline, the text."""
    return f"{label_cache._mac(label_cache.cache_key(), text.encode())}\n{text}".encode()


def _bad_caches(marker):
    """Each reaches the check that refuses it: all but the first and the last carry a valid MAC."""
    good = json.dumps({"format": label_cache.FORMAT, "version": label_cache.VERSION, "hash": "h", "data": {}})
    return {
        "random bytes": np.random.default_rng(1).bytes(2048),
        "truncated": signed(good[: len(good) // 2]),
        "text": signed("{this is not json}"),
        "other version": signed(good.replace(f'"version": {label_cache.VERSION}', '"version": 99')),
        "other program": signed(json.dumps({"format": "someone else", "data": {}})),
        "object array": signed(good.replace('"data": {}', '"data": {"a": {"__ndarray__": ["|O", [1], "AA=="]}}')),
        "version 2, unsigned": good.encode(),
        "official pickle": None,  # written below with np.save, a payload inside
    }


@pytest.mark.parametrize("kind", list(_bad_caches("m")))
def test_unusable_cache_is_rebuilt_with_one_warning(det_copy, yolo_log, kind, tmp_path):
    marker = tmp_path / "pwned"
    cache = det_copy / "labels" / "train.yolo-engine.cache"
    content = _bad_caches(marker)[kind]
    if content is None:
        np.save(str(cache) + ".npy", {"version": "0.6", "labels": [Payload(marker)]}, allow_pickle=True)
        os.replace(str(cache) + ".npy", cache)
    else:
        cache.write_bytes(content)
    ds = YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3)
    assert len(ds) == 16 and not ds.stats["cached"] and not marker.exists()
    warnings = [m for m in yolo_log if "ignoring label cache" in m]
    assert len(warnings) == 1 and str(cache) in warnings[0]
    assert YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3).stats["cached"]  # rewritten, usable


def test_the_official_cache_name_is_left_to_the_official_tools(det_copy, yolo_log):
    """Ultralytics and yolov5 keep their pickled cache in labels/train.cache: ours lives beside it, so neither tool
    makes the other rescan, and theirs is never read or rewritten."""
    official = det_copy / "labels" / "train.cache"
    official.write_bytes(b"\x93NUMPY pickled by another tool")
    YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3)
    again = YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3)
    assert again.stats["cached"] and not [m for m in yolo_log if "ignoring label cache" in m]
    assert official.read_bytes() == b"\x93NUMPY pickled by another tool"
    assert label_cache.cache_path(det_copy / "labels" / "train") == det_copy / "labels" / "train.yolo-engine.cache"
    assert label_cache.cache_path(det_copy / "train.txt") == det_copy / "train.yolo-engine.cache"


def test_a_split_of_one_image_keeps_its_cache_with_the_labels(det_copy):
    """val: images/val/x.jpg caches beside labels/val as the folder does; a cache beside the image would be listed as
    ignored, not an image, by every later scan of images/val."""
    val = det_copy / "images" / "val"
    before = sorted(val.iterdir())
    YOLODataset(str(before[0]), imgsz=96, nc=3)
    assert sorted(val.iterdir()) == before
    assert (det_copy / "labels" / "val.yolo-engine.cache").is_file()
    assert YOLODataset(str(val), imgsz=96, nc=3).stats["ignored"] == 0


def test_only_local_rank_zero_writes(det_copy, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3)
    assert not (det_copy / "labels" / "train.yolo-engine.cache").exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    YOLODataset(str(det_copy / "images" / "train"), imgsz=96, nc=3)
    assert (det_copy / "labels" / "train.yolo-engine.cache").exists()


def _bind_read_only(folder):
    """A read-only bind mount of `folder`, or None where this process may not mount (not root, no privilege)."""
    ro = folder.with_name(folder.name + "-ro")
    ro.mkdir()
    try:
        subprocess.run(["mount", "--bind", str(folder), str(ro)], check=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    r = subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True, timeout=20)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True, timeout=20)
        return None
    return ro


@pytest.fixture
def read_only_data(det_copy, tmp_path, monkeypatch):
    """(read-only dataset root, payload marker): the train cache corrupt, the val cache an official pickled one
    with a payload. A real read-only bind mount where we may mount (root); else file modes (non-root; root ignores
    them); else writes into it fail as on a read-only filesystem."""
    marker = tmp_path / "pwned"
    (det_copy / "labels" / "train.yolo-engine.cache").write_bytes(b"\x00" * 100)
    np.save(det_copy / "labels" / "val.npy", {"labels": [Payload(marker)]}, allow_pickle=True)
    os.replace(det_copy / "labels" / "val.npy", det_copy / "labels" / "val.yolo-engine.cache")
    ro = _bind_read_only(det_copy) if os.geteuid() == 0 else None
    if ro is not None:
        with pytest.raises(OSError):
            (ro / "probe").touch()
        yield ro, marker
        subprocess.run(["umount", "-l", str(ro)], capture_output=True, timeout=20)
    elif os.geteuid() != 0:
        dirs = [det_copy, *(p for p in det_copy.rglob("*") if p.is_dir())]
        for d in dirs:
            d.chmod(0o555)
        yield det_copy, marker
        for d in dirs:
            d.chmod(0o755)
    else:
        def refuse(path, *a, **k):
            raise OSError(30, "Read-only file system", str(path))

        monkeypatch.setattr(label_cache, "publish", refuse)
        yield det_copy, marker


def test_training_runs_on_read_only_data_with_corrupt_and_foreign_caches(read_only_data, tmp_path, yolo_log):
    root, marker = read_only_data
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [circle, rectangle, triangle]\n")
    trainer, metrics = train.main(train.parse_opt([
        "--data", str(data), "--cfg", "yolov5n.yaml", "--imgsz", "64", "--batch-size", "8", "--epochs", "1",
        "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs"), "--name", "exp"]))
    assert "fitness" in metrics and (trainer.save_dir / "weights" / "best.pt").is_file()
    assert (root / "labels" / "train.yolo-engine.cache").read_bytes() == b"\x00" * 100  # nothing could be written there
    assert not marker.exists()
    ignored = [m for m in yolo_log if "ignoring label cache" in m]
    assert any("train.yolo-engine.cache" in m for m in ignored) and any("val.yolo-engine.cache" in m for m in ignored)
    assert len([m for m in yolo_log if "not writeable" in m]) == 1  # one folder, one warning


@pytest.mark.slow
@pytest.mark.ddp
def test_machines_of_one_job_accept_each_others_cache(tmp_path):
    """Two ranks as the local rank 0s of two machines with different configuration folders: both sign with global
    rank 0's key, so the cache one writes in a shared folder is read by the other."""
    from tests.data.label_cache_worker import two_machines
    from tests.ddp_utils import spawn

    spawn(two_machines, 2, str(tmp_path))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["own_key"] != r1["own_key"]  # two machines' keys
    assert r0["job_key"] == r1["job_key"] == r0["own_key"]
    assert r0["read"] == r1["read"] == [0, 1, 2]
