"""Bounded cost, round 2 (issue 61; docs/safety.md, the budget): what a file says of its run is input like a command
line, and no small file costs gigabytes, minutes or the network. Each attack is built here, small, and ends in one
`error:` line (exit status 2, no traceback) or a named skip; the heavy ones run in a process whose memory is capped.
"""

import importlib
import json
import os
import struct
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import onnx
import pytest
import yaml

from data import dataset_yaml, image_cache, image_files
from data.detect_dataset import YOLODataset
from data.image_files import scan_files
from data.synthetic import generate_dataset
from models.checkpoints import model_to_ckpt, save_checkpoint
from models.yolo import DetectionModel, yaml_model_load
from tests.capped import refused_once, run_capped
from utils.budget import MAX_IMGSZ, MAX_STREAM_PIXELS, MAX_STREAMS
from utils.files import ROOT
from utils.run import run_cli


def cli(argv, capsys):
    """(exit status, the `error:` lines) of a script run as `python <argv>` would, in this process."""
    script = importlib.import_module(argv[0].removesuffix(".py").replace("/", "."))
    capsys.readouterr()
    try:
        run_cli(script.main, lambda: script.parse_opt(argv[1:]))
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, [line for line in captured.err.splitlines() if line.startswith("error:")]


def tiny_checkpoint(path, **opt):
    """A 120 KB detector (11 k weights) whose run record (`opt`) says what the attack wants."""
    d = yaml_model_load("yolov5n.yaml")
    d.pop("yaml_file")
    model = DetectionModel({**d, "width_multiple": 0.01, "depth_multiple": 0.01, "nc": 80})
    model.names = {i: f"c{i}" for i in range(80)}
    save_checkpoint({"model": model_to_ckpt(model), "ema": None, "opt": opt}, path)
    return path


@pytest.fixture
def no_download(monkeypatch):
    """Any dataset download fails the test."""
    monkeypatch.setattr(dataset_yaml, "run_download", lambda *a, **k: pytest.fail("a download was started"))


# ---------------------------------------------------------------- the run record: network and image size
def test_a_checkpoint_naming_a_dataset_with_a_download_fetches_nothing(tmp_path, capsys, monkeypatch, no_download):
    """The project's own data/coco.yaml named by a relative path (found from the working folder): val.py without
    --data refused it, naming the --data that downloads it; nothing was fetched or made."""
    monkeypatch.chdir(ROOT)
    weights = tiny_checkpoint(tmp_path / "coco.pt", train_imgsz=64, data_path="data/coco.yaml")
    code, errors = cli(["val.py", "--weights", str(weights), "--device", "cpu", "--project", str(tmp_path / "v")],
                       capsys)
    coco = yaml.safe_load((ROOT / "data" / "coco.yaml").read_text())
    root = (ROOT / coco["path"]).resolve()
    assert code == 2 and errors == [
        f"error: data/coco.yaml: dataset not found, missing {root / coco['val']}; the run record of {weights} names "
        "it, and what a file names is not downloaded: give --data data/coco.yaml to download it"]
    assert not root.exists() and not (tmp_path / "v").exists()


def test_the_same_dataset_given_on_the_command_line_is_downloaded(tmp_path, capsys, monkeypatch):
    """The user's own --data still downloads (the fetch itself replaced here: no network in tests)."""
    asked = []
    monkeypatch.setattr(dataset_yaml, "run_download", lambda spec, label, root: asked.append(label))
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump({"path": str(tmp_path / "gone"), "train": "images", "val": "images", "names": ["a"],
                                 "download": "https://example.com/d.zip"}))
    with pytest.raises(dataset_yaml.DatasetNotFoundError):
        dataset_yaml.check_det_dataset(str(f))
    assert asked == [str(f)]
    with pytest.raises(dataset_yaml.DatasetNotFoundError, match="names it, and what a file names is not downloaded"):
        dataset_yaml.check_det_dataset(dataset_yaml.NamedByFile(str(f), "the run record of x.pt"))
    assert asked == [str(f)]


def test_an_export_naming_a_dataset_with_a_download_fetches_nothing(tmp_path, capsys, monkeypatch, no_download):
    monkeypatch.chdir(ROOT)
    weights = tiny_checkpoint(tmp_path / "coco.pt", train_imgsz=64, data_path="data/coco.yaml")
    code, errors = cli(["export.py", "--weights", str(weights), "--include", "onnx"], capsys)
    onnx_file = weights.with_suffix(".onnx")
    assert code == 0 and json.loads(onnx.load(str(onnx_file)).metadata_props[0].value)["data"] == "data/coco.yaml"
    code, errors = cli(["val.py", "--weights", str(onnx_file), "--device", "cpu", "--project", str(tmp_path / "v")],
                       capsys)
    assert code == 2 and len(errors) == 1 and f"the run record of {onnx_file} names it" in errors[0]


def _with_metadata(onnx_file, out, **changes):
    model = onnx.load(str(onnx_file))
    prop = next(p for p in model.metadata_props if p.key == "yolo")
    prop.value = json.dumps({**json.loads(prop.value), **changes})
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize("script", ["val.py", "detect.py"])
def test_an_image_size_from_a_checkpoint_is_bounded_as_img_is(tmp_path, script):
    """train_imgsz 12000 in a checkpoint: detect took 2.27 GB and val 2.73 GB before running out of memory. Now one
    line, in a process whose memory is capped, far under it."""
    weights = tiny_checkpoint(tmp_path / "big.pt", train_imgsz=12000)
    r = run_capped([script, "--weights", str(weights), "--device", "cpu", "--project", str(tmp_path / "r")])
    assert refused_once(r, f"{weights}: its run record gives image size 12000, larger than the {MAX_IMGSZ} that "
                           "--img takes"), r.stderr[-2000:]
    assert r.peak < 1 << 30


def test_an_image_size_from_an_export_is_bounded_as_img_is(tmp_path, capsys):
    weights = tiny_checkpoint(tmp_path / "ok.pt", train_imgsz=64)
    assert cli(["export.py", "--weights", str(weights), "--include", "onnx"], capsys)[0] == 0
    big = _with_metadata(weights.with_suffix(".onnx"), tmp_path / "big.onnx", imgsz=[4160, 4160])
    code, errors = cli(["detect.py", "--weights", str(big), "--device", "cpu", "--project", str(tmp_path / "r")],
                       capsys)
    assert (code, errors) == (2, [f"error: {big}: its run record gives image size 4160, larger than the {MAX_IMGSZ} "
                                  "that --img takes (docs/safety.md)"])


@pytest.mark.parametrize("value, error", [
    ({"download": "https://example.com/x.zip"}, "its run record's dataset is dict {'download': "),
    (["data/coco.yaml"], "its run record's dataset is list ['data/coco.yaml'], not a path"),
])
def test_a_dataset_in_a_run_record_is_a_path(tmp_path, capsys, value, error):
    """A mapping where the path should be was a TypeError traceback."""
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64, data_path=value)
    code, errors = cli(["val.py", "--weights", str(weights), "--device", "cpu", "--project", str(tmp_path / "v")],
                       capsys)
    assert code == 2 and len(errors) == 1 and errors[0].startswith(f"error: {weights}: {error}")


@pytest.mark.parametrize("argv", [["detect.py", "--img", "4097"], ["val.py", "--weights", "x.pt", "--img", "9000"],
                                  ["export.py", "--weights", "x.pt", "--img", "640", "5000"]])
def test_img_is_bounded(capsys, argv):
    value = argv[-1]
    assert cli(argv, capsys) == (2, [f"error: --imgsz {value}: must be in [1, {MAX_IMGSZ}]"])


# ---------------------------------------------------------------- listings: list files, folder scans, label pairs
@pytest.fixture(scope="module")
def big_folder(tmp_path_factory):
    """A folder of 5,000 (empty) .jpg files."""
    folder = tmp_path_factory.mktemp("big")
    for i in range(5_000):
        (folder / f"{i:05d}.jpg").touch()
    return folder


def test_a_list_naming_one_folder_60_times_lists_it_once(big_folder, tmp_path):
    """300 bytes naming a folder 60 times took 2.7 GB and was still scanning after 180 s (a folder of 100 k images):
    each line was walked, and the repeats dropped only at the end."""
    listing = tmp_path / "list.txt"
    listing.write_text(f"{big_folder}\n" * 60)
    t = time.monotonic()
    files, others = scan_files(str(listing))
    assert len(files) == 5_000 and time.monotonic() - t < 30
    assert others == [(str(big_folder), "a repeated entry (used once)")] * 59


def test_a_listing_meeting_too_many_entries_is_one_error(big_folder, tmp_path, monkeypatch, capsys):
    """60 globs that each list the whole folder (text that differs, the same files): every folder a wildcard looks
    into counts. The limit is lowered here (the budget's 4,000,000 would take 800 globs of this folder)."""
    monkeypatch.setattr(image_files, "MAX_SCAN_ENTRIES", 100_000)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{big_folder}/{'*' * (k + 1)}.jpg\n" for k in range(60)))
    with pytest.raises(image_files.ListingTooLarge, match="listing it meets more than 100000 entries"):
        scan_files(str(listing))
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(listing), "--device", "cpu",
                        "--project", str(tmp_path / "r")], capsys)
    assert code == 2 and len(errors) == 1 and errors[0].startswith(f"error: --source {listing}: {listing}: listing "
                                                                   "it meets more than 100000 entries")


def test_a_long_listing_says_how_far_it_has_got(big_folder, monkeypatch, yolo_log):
    monkeypatch.setattr(image_files, "SCAN_NOTE_SECONDS", 0)
    scan_files(str(big_folder))
    assert [m for m in yolo_log if m.startswith(f"listing {big_folder}: 5000 entries so far")]


def test_a_list_file_over_its_budget_is_refused_unread(tmp_path, monkeypatch):
    listing = tmp_path / "list.txt"
    listing.write_text("a.jpg\n" * 1000)
    monkeypatch.setattr(image_files, "MAX_LIST_BYTES", 1000)
    with pytest.raises(image_files.ListingTooLarge, match=r"a list file of 6000 bytes, more than the 1000 a list"):
        scan_files(str(listing))


def test_a_folder_deeper_than_pythons_recursion_is_walked(tmp_path):
    """Folders deeper than Python's recursion limit were a RecursionError. Here the limit is lowered to 250 and the
    folders are 400 deep: deep enough to show it, shallow enough for shutil.rmtree (pytest's clean-up), which
    recurses."""
    deep = tmp_path / "/".join(["d"] * 400)
    deep.mkdir(parents=True)
    (deep / "x.jpg").touch()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)
    try:
        found = scan_files(str(tmp_path))[0]
    finally:
        sys.setrecursionlimit(limit)
    assert found == [str(deep / "x.jpg")]


def test_two_images_one_label_file_is_an_error_naming_both(tmp_path, capsys):
    """A blank X.png beside a labelled X.jpg: both took X.txt ("16 images (0 backgrounds)", no warning)."""
    root = generate_dataset(tmp_path / "d", "detect", 4, 2, seed=0, min_side=64, max_side=64, max_objects=1)
    jpg = root / "images" / "train" / "00001.jpg"
    cv2.imwrite(str(jpg.with_suffix(".png")), np.zeros((64, 64, 3), np.uint8))
    (root / "d.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                 "names": ["circle", "rectangle", "triangle"]}))
    code, errors = cli(["train.py", "--data", str(root / "d.yaml"), "--img", "64", "--epochs", "1", "--device", "cpu",
                        "--project", str(tmp_path / "runs")], capsys)
    assert (code, errors) == (2, [
        f"error: {jpg} and {jpg.with_suffix('.png')} would both take the label file "
        f"{root / 'labels' / 'train' / '00001.txt'}: one label file cannot be both images'; rename or remove one "
        "of them"])


@pytest.mark.parametrize("name", ["pipe.jpg", "cams.streams"])
def test_a_fifo_as_source_says_what_it_is(tmp_path, capsys, name):
    """It said "does not exist"."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(fifo), "--device", "cpu",
                        "--project", str(tmp_path / "r")], capsys)
    said = f"{fifo} is" if name.endswith(".jpg") else "it is"
    assert (code, errors) == (2, [f"error: --source {fifo}: {said} not a regular file (a device, pipe or socket)"])


# ---------------------------------------------------------------- .streams
@pytest.fixture(scope="module")
def video_4k(tmp_path_factory):
    """Two frames of 3840 x 2160 (each 25 MB decoded; a reader holds about 75 MB)."""
    path = tmp_path_factory.mktemp("4k") / "4k.mp4"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (3840, 2160))
    for k in range(2):
        w.write(np.full((2160, 3840, 3), 60 * k, np.uint8))
    w.release()
    return path


def test_a_streams_file_over_its_pixel_budget_reads_no_frame(video_4k, tmp_path):
    """A 93 KB .streams file listing a 4K video 40-100 times took 1.98 GB, then aborted ("terminate called"). Five
    4K sources are over the 33,177,600 pixels read at once: one line, no abort. The sources open at once, and none
    reads a frame before all have opened and are accepted (tests/test_stream_refusal.py): the peak stays under what
    four 4K streams, the budget, take (about 0.5 GB beside the model). The cap is 4 GiB here: under 2 GiB of address
    space FFmpeg cannot open a 4K decoder beside torch's libraries."""
    names = []
    for k in range(5):
        (tmp_path / f"cam{k}.mp4").symlink_to(video_4k)
        names.append(str(tmp_path / f"cam{k}.mp4"))
    listing = tmp_path / "cams.streams"
    listing.write_text("\n".join(names * 20) + "\n")  # each line 20 times: every source is opened once
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    r = run_capped(["detect.py", "--weights", str(weights), "--source", str(listing), "--device", "cpu",
                    "--project", str(tmp_path / "r")], limit=4 << 30)
    assert refused_once(r, f"whose frames hold {5 * 3840 * 2160} pixels together, more than the {MAX_STREAM_PIXELS} "
                           "read at once"), r.stderr[-2000:]
    assert r.peak < 1.5 * 2**30 and "95 repeated lines, each source read once" in r.stdout


def test_a_streams_file_names_at_most_its_budget_of_sources(tmp_path, capsys):
    listing = tmp_path / "cams.streams"
    listing.write_text("".join(f"rtsp://127.0.0.1:9/cam{k}\n" for k in range(MAX_STREAMS + 1)))
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(listing), "--device", "cpu",
                        "--project", str(tmp_path / "r")], capsys)
    assert (code, errors) == (2, [f"error: --source {listing}: lists {MAX_STREAMS + 1} streams, more than the "
                                  f"{MAX_STREAMS} read at once (docs/safety.md)"])


# ---------------------------------------------------------------- synthetic:
def _synthetic_yaml(path, spec):
    path.write_text(yaml.safe_dump({"path": str(path.parent / "gen"), "train": "images/train", "val": "images/val",
                                    "names": ["circle", "rectangle", "triangle"], "synthetic": spec}))
    return path


@pytest.mark.parametrize("spec, error", [
    ({"n_train": 100_000, "n_val": 20_000, "min_side": 1024, "max_side": 1024, "max_objects": 1000},
     "synthetic.max_objects must be an integer 1..16, got 1000"),
    ({"n_train": 100_000, "n_val": 20_000, "min_side": 1024, "max_side": 1024},
     f"its synthetic images would take {120_000 * (1024 ** 2 + 65536)} pixels' worth to draw, more than the "
     "150000000 a dataset YAML may ask for"),
    ({"n_train": 10, "min_side": 200, "max_side": 100}, "synthetic.min_side 200 is larger than max_side 100"),
    ({"task": "paint"}, "synthetic.task must be one of detect, segment, pose, obb, classify, got 'paint'"),
    ("lots", "'synthetic' must be a mapping of"),
])
def test_a_synthetic_entry_over_its_budget_is_refused_before_anything_is_drawn(tmp_path, capsys, spec, error):
    """The old bound (211 bytes: 120,000 images of 1024 px with 1,000 shapes each) was still drawing after 60 s
    (167 MB written; about 10 GB in all). A task or a side the generator refuses was a ValueError traceback."""
    f = _synthetic_yaml(tmp_path / "d.yaml", spec)
    code, errors = cli(["train.py", "--data", str(f), "--img", "64", "--epochs", "1", "--device", "cpu",
                        "--project", str(tmp_path / "runs")], capsys)
    assert code == 2 and len(errors) == 1 and errors[0].startswith(f"error: {f}: {error}"), errors
    assert not (tmp_path / "gen").exists() and not list(tmp_path.glob(".gen*"))


@pytest.mark.slow
def test_a_synthetic_entry_at_its_bound_is_drawn_in_seconds(tmp_path):
    """The largest images at the most shapes, and the most (smallest) images: each well under a minute on a busy
    2-core CPU (about 7 and 11 s unloaded)."""
    for name, spec in (("big", {"n_train": 126, "n_val": 8, "min_side": 1024, "max_side": 1024, "max_objects": 16}),
                       ("many", {"n_train": 2200, "n_val": 79, "min_side": 16, "max_side": 16, "max_objects": 16})):
        (tmp_path / name).mkdir()
        f = _synthetic_yaml(tmp_path / name / "d.yaml", spec)
        t = time.monotonic()
        dataset_yaml.check_det_dataset(str(f))
        assert time.monotonic() - t < 60, name


# ---------------------------------------------------------------- --cache disk / ram
def _jpeg_declaring(side):
    """629 bytes: an 8x8 JPEG whose frame header declares side x side, cut short (OpenCV decodes it to side^2 x 3)."""
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    data = bytearray(buf.tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", side, side)
    return bytes(data[:629])


@pytest.fixture
def cache_bombs(tmp_path):
    """A detection set whose 8 training images are 629-byte JPEGs declaring 9000 x 9000 (81 M pixels, under the
    pixel limit; 243 MB each decoded), and its YAML."""
    root = generate_dataset(tmp_path / "d", "detect", 8, 2, seed=0, min_side=64, max_side=64, max_objects=1)
    for f in (root / "images" / "train").iterdir():
        f.write_bytes(_jpeg_declaring(9000))
    (root / "d.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                 "names": ["circle", "rectangle", "triangle"]}))
    return root


def test_a_disk_cache_of_header_bombs_is_refused_before_a_write(cache_bombs, tmp_path):
    """--cache disk wrote 243 MB per 629-byte image (972 MB), then crashed at 2.2 GB (SIGSEGV, or a traceback). Now
    one line before a copy is written. (The label scan still decodes each truncated JPEG once to judge it, as any
    training run reads an image under the pixel limit.)"""
    r = run_capped(["train.py", "--data", str(cache_bombs / "d.yaml"), "--cache", "disk", "--img", "64", "--epochs",
                    "1", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--project", str(tmp_path / "runs")])
    assert refused_once(r, "--cache disk: the headers of 8 images declare 1.81 GiB of pixels, more than 100x the 5032 "
                           "bytes of their files (at least 0.25 GiB) that a cache may take"), r.stderr[-2000:]
    assert not list(cache_bombs.rglob("*.npy"))


def test_a_ram_cache_over_the_memory_left_is_refused(cache_bombs, monkeypatch):
    """Resized to --img for detection, the bombs take little; the budget is the memory this process may still take
    (here made 1.2 GiB, less the 1 GiB margin)."""
    monkeypatch.setattr(image_cache, "available_memory", lambda: int(1.2 * 2**30))
    with pytest.raises(image_cache.CacheTooLarge, match=r"--cache ram: 8 images take 0.\d\d GiB cached, more than "
                                                         r"0.20 GiB of the memory this process may still take"):
        YOLODataset(str(cache_bombs / "images" / "train"), imgsz=4096, cache="ram", nc=3)


def test_the_ranks_of_one_machine_share_the_cache_budget(cache_bombs, monkeypatch):
    """Each rank caches its own share at the same time as the others of its machine: each is judged against its part
    of the memory (and of the free disk), not the whole, which all of them see (issue 61)."""
    monkeypatch.setattr(image_cache, "available_memory", lambda: 2**30 + 2**28)  # 0.25 GiB over the margin
    files = [str(f) for f in sorted((cache_bombs / "images" / "train").iterdir())]
    kept = [(240, 240)] * len(files)  # 1.32 MiB: fits a quarter, not a 256th
    image_cache.check_budget("ram", files, [(9000, 9000)] * len(files), kept=kept)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "256")
    with pytest.raises(image_cache.CacheTooLarge, match=r"more than 0.00 GiB \(a 256th, for each of the 256 processes "
                                                         r"of this machine\) of the memory"):
        image_cache.check_budget("ram", files, [(9000, 9000)] * len(files), kept=kept)
    free = image_cache.shutil.disk_usage(cache_bombs).free
    monkeypatch.setattr(image_cache.shutil, "disk_usage", lambda p: SimpleNamespace(free=free))
    monkeypatch.setattr(image_cache, "DISK_MARGIN", free - 256 * 2**20)  # 256 MiB to spare: 1 MiB a rank
    small = [(300, 300)] * len(files)  # 2.06 MiB of copies
    with pytest.raises(image_cache.CacheTooLarge, match=r"keeps .* so \(a 256th, for each of the 256 processes"):
        image_cache.check_budget("disk", files, small, copies=lambda f: Path(f + ".npy"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    image_cache.check_budget("disk", files, small, copies=lambda f: Path(f + ".npy"))


def test_a_disk_cache_writes_beside_images_only_inside_the_split(tmp_path):
    """A list in one folder naming images in another (another user's, /etc): their copies go to the split's own
    cache folder beside its label cache, none beside them; they are read back from there."""
    root = generate_dataset(tmp_path / "d", "detect", 4, 2, seed=0, min_side=64, max_side=64, max_objects=1)
    elsewhere = tmp_path / "elsewhere" / "images"
    elsewhere.mkdir(parents=True)
    outside = elsewhere / "x.jpg"
    cv2.imwrite(str(outside), np.full((64, 64, 3), 50, np.uint8))
    listing = root / "train.txt"
    listing.write_text(f"./images/train/00000.jpg\n{outside}\n")
    ds = YOLODataset(str(listing), imgsz=64, cache="disk", nc=3)
    assert image_files.disk_cache_path(root / "images" / "train" / "00000.jpg").is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["x.jpg"]
    copies = list((root / "train.yolo-engine-npy").iterdir())
    assert len(copies) == 1 and copies[0] == ds.copies(str(outside))
    np.testing.assert_array_equal(ds._read(ds.im_files.index(str(outside))), cv2.imread(str(outside)))


def test_images_near_the_pixel_limit_are_decoded_a_few_at_a_time():
    """Eight threads decoding 243 MB each at once was the 2.2 GB crash: at most MAX_DECODE_BYTES (1 GiB) at once."""
    busy, most, lock = [0], [0], threading.Lock()

    def decode(k):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.05)
        with lock:
            busy[0] -= 1

    image_cache.decoding([(9000, 9000)] * 16, decode, range(16))
    assert most[0] == (1 << 30) // (9000 * 9000 * 3) == 4
    most[0] = 0
    image_cache.decoding([(640, 640)] * 16, decode, range(16))
    assert most[0] == image_cache.THREADS


def test_a_file_name_with_escape_characters_is_saved_escaped(tmp_path, capsys):
    """The saved copy kept the raw name: `ls` of the run folder would clear the screen and print a forged line."""
    src = tmp_path / "src"
    src.mkdir()
    raw = "a\x1b[2J\rAll checks passed\nb.jpg"
    cv2.imwrite(str(tmp_path / "x.jpg"), np.full((64, 64, 3), 90, np.uint8))
    os.rename(tmp_path / "x.jpg", src / raw)
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(src), "--device", "cpu", "--save-txt",
                        "--save-crop", "--save-csv", "--conf-thres", "0", "--project", str(tmp_path / "r")], capsys)
    saved = [str(p.relative_to(tmp_path / "r" / "exp")) for p in (tmp_path / "r" / "exp").rglob("*") if p.is_file()]
    escaped = "a\\x1b[2J\\rAll checks passed\\nb"
    assert code == 0 and errors == [] and f"{escaped}.jpg" in saved and f"labels/{escaped}.txt" in saved
    assert not any("\x1b" in name or "\n" in name or "\r" in name for name in saved)


# ---------------------------------------------------------------- found attacking the new code (issue 61's last item)
def test_a_fifo_named_in_a_streams_file_is_refused_not_waited_on(tmp_path, capsys):
    """FFmpeg's open of a FIFO waits for a writer for ever: the command hung."""
    fifo = tmp_path / "cam.mp4"
    os.mkfifo(fifo)
    listing = tmp_path / "cams.streams"
    listing.write_text(f"{fifo}\n")
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(listing), "--device", "cpu",
                        "--project", str(tmp_path / "r")], capsys)
    assert (code, errors) == (2, [f"error: --source {listing}: its source {fifo} is not a regular file (a device, "
                                  "pipe or socket); a stream is a URL, a webcam index or device, or a video file"])


def test_a_list_entry_too_long_for_the_system_is_a_named_skip(tmp_path):
    """A 5,000-character line was an OSError traceback (File name too long) from Path.exists."""
    root = generate_dataset(tmp_path / "d", "detect", 2, 1, seed=0, min_side=64, max_side=64, max_objects=1)
    listing = root / "train.txt"
    listing.write_text(f"./images/train/00000.jpg\n{'a' * 5000}.jpg\n")
    ds = YOLODataset(str(listing), imgsz=64, nc=3)
    assert len(ds) == 1 and any("File name too long" in p for p in ds.problems)


def test_sparse_image_files_buy_no_cache_budget(cache_bombs):
    """Judged by st_size, header bombs padded with a 64 MiB hole (nothing on disk) would allow 51 GiB of copies."""
    for f in (cache_bombs / "images" / "train").iterdir():
        with open(f, "r+b") as fh:
            fh.truncate(64 << 20)
    with pytest.raises(image_cache.CacheTooLarge, match="--cache disk: the headers of 8 images declare 1.81 GiB"):
        YOLODataset(str(cache_bombs / "images" / "train"), imgsz=64, cache="disk", nc=3)


class _GrowingCapture:
    """A capture that opens as 64 x 64 and then hands out 4000 x 4000 frames (a stream's size change)."""

    def __init__(self, *args, **kwargs):
        self.n = 0

    def isOpened(self):  # noqa: N802 (OpenCV's names)
        return True

    def get(self, prop):
        return {cv2.CAP_PROP_FRAME_WIDTH: 64, cv2.CAP_PROP_FRAME_HEIGHT: 64, cv2.CAP_PROP_FPS: 10,
                cv2.CAP_PROP_FRAME_COUNT: 5}.get(prop, 0)

    def grab(self):
        self.n += 1
        return self.n <= 5

    def retrieve(self):
        side = 64 if self.n == 1 else 4000
        return True, np.zeros((side, side, 3), np.uint8)

    def read(self):
        return (self.retrieve() if self.grab() else (False, None))

    def release(self):
        pass


def test_frames_larger_than_their_video_opened_with_are_not_read_on(tmp_path, monkeypatch, yolo_log):
    """The pixel limit was checked on opening only: a stream (or video) that grows its frames afterwards was read at
    any size."""
    from data.sources import LoadImages
    from data.streams import LoadStreams

    monkeypatch.setattr(cv2, "VideoCapture", _GrowingCapture)
    video = tmp_path / "v.mp4"
    video.write_bytes(b"\0" * 64)
    assert len(list(LoadImages(str(video), imgsz=64))) == 1
    assert len(list(LoadStreams(["rtsp://127.0.0.1:9/cam"], imgsz=64, timeout=2))) == 1
    assert [m for m in yolo_log if "a frame of 4000x4000, larger than" in m] == [
        f"WARNING: video {video}: a frame of 4000x4000, larger than the size it opened with; the rest of it is "
        "skipped", "WARNING: stream rtsp://127.0.0.1:9/cam: a frame of 4000x4000, larger than the 64x64 it opened "
        "with; stopped"]


def test_a_list_line_holding_a_nul_byte_is_a_note(tmp_path):
    """It was a ValueError traceback (embedded null byte) from Path.resolve."""
    root = generate_dataset(tmp_path / "d", "detect", 2, 1, seed=0, min_side=64, max_side=64, max_objects=1)
    listing = root / "train.txt"
    listing.write_bytes(b"./images/train/00000.jpg\nx\0y.jpg\n")
    ds = YOLODataset(str(listing), imgsz=64, nc=3)
    assert len(ds) == 1 and "x\0y.jpg: ignored, holds a NUL byte, which no file name can" in ds.problems


def test_a_streams_line_holding_a_nul_byte_is_refused(tmp_path, capsys):
    """OpenCV opened the name up to the NUL byte: a FIFO there would be waited on for ever, unchecked."""
    listing = tmp_path / "cams.streams"
    listing.write_bytes(f"{tmp_path / 'cam.mp4'}\0x\n".encode())
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", str(listing), "--device", "cpu",
                        "--project", str(tmp_path / "r")], capsys)
    assert (code, errors) == (2, [f"error: --source {listing}: its source {tmp_path / 'cam.mp4'}\\x00x holds a NUL "
                                  "byte"])
