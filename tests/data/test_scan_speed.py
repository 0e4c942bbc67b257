"""The fast label scan (issue 60): a JPEG's size read from its header gives the decoder's shape and verdict, a plain
label text parsed at once gives bit-identical records, and a scan spread over processes gives the serial scan's
records in order."""

import io
import os
import struct

import cv2
import numpy as np
import pytest
from PIL import Image

from data import labels as labels_mod
from data.jpeg_header import plain_jpeg_size
from data.label_formats import DetectLabels, OBBLabels, PoseLabels, SegmentLabels


def _jpeg(path, w=80, h=50, orientation=None, progressive=False, mode="RGB", little_endian=False):
    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), np.uint8)).convert(mode)
    kw = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kw["exif"] = exif.tobytes()
    buf = io.BytesIO()
    im.save(buf, "JPEG", progressive=progressive, **kw)
    data = buf.getvalue()
    if little_endian:  # PIL writes MM: rewrite the EXIF block's TIFF header and orientation entry as II
        i = data.index(b"Exif\x00\x00MM") + 6
        tiff = bytearray(data[i:])
        (ifd,) = struct.unpack(">I", tiff[4:8])
        (n,) = struct.unpack(">H", tiff[ifd:ifd + 2])
        assert n == 1, "one entry: the orientation"
        tag, kind, count, value = struct.unpack(">HHIH", tiff[ifd + 2:ifd + 12])
        tiff[:8] = b"II*\x00" + struct.pack("<I", ifd)
        tiff[ifd:ifd + 14] = struct.pack("<HHHIHH", 1, tag, kind, count, value, 0)
        data = data[:i] + bytes(tiff)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("variant", ["baseline", "progressive", "grey", "little-endian EXIF"])
def test_header_size_is_the_decoded_shape(tmp_path, orientation, variant):
    if variant == "little-endian EXIF" and orientation is None:
        pytest.skip("no EXIF block to rewrite")
    f = _jpeg(tmp_path / "a.jpg", orientation=orientation, progressive=variant == "progressive",
              mode="L" if variant == "grey" else "RGB", little_endian=variant == "little-endian EXIF")
    assert plain_jpeg_size(str(f)) == cv2.imread(str(f)).shape[:2]


def test_header_answers_only_where_sure(tmp_path):
    """Truncated JPEGs, CMYK, PNGs and an out-of-range orientation are left to the decoder (None)."""
    f = _jpeg(tmp_path / "a.jpg")
    data = f.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) * 2 // 3])
    Image.open(f).convert("CMYK").save(tmp_path / "cmyk.jpg")
    cv2.imwrite(str(tmp_path / "b.png"), cv2.imread(str(f)))
    _jpeg(tmp_path / "o9.jpg", orientation=9)
    (tmp_path / "header-only.jpg").write_bytes(data[:200] + b"\xff\xd9")  # cut inside the header, then an EOI
    for name in ("cut.jpg", "cmyk.jpg", "b.png", "o9.jpg", "header-only.jpg"):
        assert plain_jpeg_size(str(tmp_path / name)) is None, name


def test_damaged_scan_data_keeps_the_decoders_verdict(tmp_path):
    """A JPEG with garbage in its entropy-coded data but whole markers: libjpeg decodes it (with a warning), and the
    scan, which reads only the header, keeps it at the same size."""
    f = _jpeg(tmp_path / "a.jpg", w=120, h=90)
    data = bytearray(f.read_bytes())
    sos = data.index(b"\xff\xda")
    rng = np.random.default_rng(1)
    for k in rng.integers(sos + 20, len(data) - 4, 40):
        data[k] = int(rng.integers(0, 255))  # never 0xff: no marker is made
    f.write_bytes(bytes(data))
    decoded = cv2.imread(str(f))
    assert decoded is not None
    rec = labels_mod.verify_image_label(str(f), str(tmp_path / "a.txt"), nc=1)
    assert rec["skipped"] == "" and rec["shape"] == decoded.shape[:2] and rec["truncated"] == 0


def _line_by_line(text, nc, fmt):
    """parse_label_file's per-line path, with the fast path turned off."""
    orig = labels_mod._plain_rows
    labels_mod._plain_rows = lambda *a: None
    try:
        return labels_mod.parse_label_file(None, nc, fmt, (text, "x.txt", "line"))
    finally:
        labels_mod._plain_rows = orig


def _polygon(rng, spread=0.0):
    k = int(rng.integers(3, 40))
    t = np.sort(rng.uniform(0, 2 * np.pi, k))
    c, r = rng.uniform(0.2, 0.8, 2), rng.uniform(0.02, 0.2, 2)
    xy = np.stack([c[0] + np.cos(t) * r[0], c[1] + np.sin(t) * r[1]], 1) + rng.uniform(-spread, spread, (k, 2))
    return " ".join(f"{v:.6f}" for v in xy.reshape(-1))


def _box(rng):
    (x, y), (w, h) = rng.uniform(0.05, 0.95, 2), rng.uniform(0.001, 0.1, 2)
    return f"{x:.6f} {y:.6f} {w:.6f} {h:.6f}"


def _keypoints(rng, k, ndim):
    kp = []
    for _ in range(k):
        v = int(rng.integers(0, 3))
        xy = rng.uniform(-0.005, 1.005, 2) if v or ndim == 2 else (0, 0)  # a few within the clipping tolerance
        kp += [f"{xy[0]:.6f}", f"{xy[1]:.6f}"] + ([str(v)] if ndim == 3 else [])
    return " ".join(kp)


def _generated(fmt, rng):
    """Ordinary label texts of the format (some rows clipped within the tolerance)."""
    for _ in range(150):
        rows = []
        for c in rng.integers(0, 5, int(rng.integers(1, 12))):
            if isinstance(fmt, PoseLabels):
                rows.append(f"{c} {_box(rng)} {_keypoints(rng, *fmt.kpt_shape)}")
            elif isinstance(fmt, OBBLabels):
                rows.append(f"{c} " + " ".join(f"{v:.6f}" for v in _corners(rng)))
            else:
                rows.append(f"{c} {_box(rng) if rng.random() < 0.3 else _polygon(rng, 0.01)}")
        yield "\n".join(rows) + "\n"


def _corners(rng):
    (cx, cy), (w, h), a = rng.uniform(0.2, 0.8, 2), rng.uniform(0.02, 0.3, 2), rng.uniform(0, np.pi)
    d = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return (d @ rot.T + (cx, cy)).reshape(-1)


EDGES = [
    "0 0.5 0.5 0.2 0.2\n1.0 .5 5e-1 2E-1 +0.2\r\n\n",  # other plain notations
    "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n",  # a duplicate row
    "0 0.5 0.5 0.2 0.2\n0 0.5000001 0.5 0.2 0.2\n",  # alike after rounding to 6 decimals
    "0 0.95 0.5 0.2 0.2\n",  # clipped
    "0 1.02 0.5 0.2 0.2\n",  # outside the tolerance
    "7 0.5 0.5 0.2 0.2\n",  # class >= nc
    "0 0.5 0.5 0 0.2\n",  # zero width
    "0 0.5 0.5 1e999 0.2\n",  # overflow to inf
    "0 0.1 0.1 0.5 0.1 0.3 0.6\n",  # a polygon
    "0 0.1 0.1 0.5 0.1 0.3 0.6\n0 0.1 0.1 0.5 0.1 0.3 0.6\n",  # a duplicate polygon
    "0 0.1 0.1 0.5 0.1 0.3 0.6\n0 0.1 0.1 0.5 0.1 0.3 0.7\n",  # same box, other outline: both kept
    "0 0.1 0.1 0.5 0.1 0.9 0.1\n",  # points on one line
    "0 0.1 0.1 0.5 0.1 0.1 0.10000000001\n",  # area just under the threshold
    "0 -0.005 0.1 0.5 0.1 0.3 0.6\n",  # a polygon clipped
    "0 0.1 0.1 0.5 0.1 0.3\n",  # odd coordinates
    "0 0.5 0.5 0.2 0.2 \u00a0\n1 0.2 0.2 0.1 0.1\n",  # a no-break space
    "0 0.5 0.5 0.2 0.2 0.3 0.3 2 0.6 0.6 1\n",  # pose of 2 keypoints
    "0 0.5 0.5 0.2 0.2 0.3 0.3 3 0.6 0.6 1\n",  # visibility 3
    "0 0.5 0.5 0.2 0.2 0.3 0.3 1.5 0.6 0.6 1\n",  # visibility 1.5
    "0 0.5 0.5 0.2 0.2 1.3 0.3 0 0.6 0.6 1\n",  # an unlabelled keypoint's coordinates are not read
    "0 0.5 0.5 0.2 0.2 1.3 0.3 2 0.6 0.6 1\n",  # a labelled one's are
    "0 0.5 0.5 0.2 0.2 1.003 0.3 2 0.6 0.6 1\n",  # clipped keypoint
    "0 0.1 0.1 0.4 0.1 0.4 0.4 0.1 0.4\n",  # four corners
    "0 -0.05 0.1 0.4 0.1 0.4 0.4 -0.05 0.4\n",  # corners past the edge (DOTA tiles)
]


def _agree(got, want, text):
    for k in ("cls", "bboxes"):
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, text
        assert got[k].tobytes() == want[k].tobytes(), text
    (key,) = set(got) - {"cls", "bboxes"}
    assert len(got[key]) == len(want[key]), text
    for a, b in zip(got[key], want[key]):
        assert (a is None and b is None) or (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())


@pytest.mark.parametrize("fmt", [DetectLabels(), SegmentLabels(), PoseLabels((2, 3)), PoseLabels((3, 2)),
                                 OBBLabels()], ids=["detect", "segment", "pose", "pose-2d", "obb"])
def test_plain_labels_parse_bit_identical(fmt, tmp_path):
    """Every format's whole-text parse gives the line-by-line records, counts and notes, bit for bit, or leaves the
    text to it."""
    engaged = 0
    for text in [*_generated(fmt, np.random.default_rng(0)), *EDGES]:
        try:
            want = _line_by_line(text, 5, fmt)
        except ValueError:  # refused by the per-line path, which names the line: never read at once
            assert labels_mod._plain_rows(text, 5, fmt) is None, text
            continue
        engaged += labels_mod._plain_rows(text, 5, fmt) is not None
        got = _parse_text(text, fmt, tmp_path)
        assert got[1:] == want[1:], text  # counts (clipped, duplicates) and notes
        _agree(got[0], want[0], text)
    assert engaged >= 150  # the generated texts take the fast path


def _parse_text(text, fmt, folder):
    f = folder / "label.txt"
    f.write_text(text, encoding="utf-8")
    return labels_mod.parse_label_file(str(f), 5, fmt)


def test_a_format_reading_lines_its_own_way_is_read_line_by_line(tmp_path):
    """A format that overrides `parse` but inherits another's `parse_plain` must not be read by that one."""

    class Halved(DetectLabels):
        def parse(self, xy):
            box, extra, clipped = super().parse(xy)
            return box / 2, extra, clipped

    text = "0 0.5 0.5 0.2 0.2\n"
    assert labels_mod._plain_rows(text, None, Halved()) is None
    assert labels_mod._plain_rows(text, None, DetectLabels()) is not None
    assert labels_mod._plain_rows(text, None, SegmentLabels()) is not None  # inherits both: reads as detect does
    halved = _parse_text(text, Halved(), tmp_path)[0]["bboxes"]
    assert halved.tobytes() == (np.array([[0.5, 0.5, 0.2, 0.2]], np.float32) / 2).tobytes()


def test_pose_labels_are_not_read_as_boxes():
    assert labels_mod._plain_rows("0 0.5 0.5 0.2 0.2\n", None, PoseLabels((1, 3))) is None


def test_pool_scan_equals_serial(tmp_path):
    """300 images (some bad) scanned by 2 forked processes: the serial scan's records, in the same order."""
    img, lab = tmp_path / "images", tmp_path / "labels"
    img.mkdir()
    lab.mkdir()
    rng = np.random.default_rng(0)
    ims, lbs = [], []
    for i in range(300):
        f = img / f"{i:03d}.jpg"
        cv2.imwrite(str(f), rng.integers(0, 255, (int(rng.integers(12, 30)), 20, 3), np.uint8))
        if i % 37 == 0:
            f.write_bytes(b"not an image")
        (lab / f"{i:03d}.txt").write_text("0 0.5 0.5 0.2 0.2\n" if i % 29 else "9 0.5 0.5 0.2 0.2\n")
        ims.append(str(f))
        lbs.append(str(lab / f"{i:03d}.txt"))
    fmt = DetectLabels()
    serial = labels_mod._build(ims, lbs, 3, 1, fmt, None, {})
    pooled = labels_mod._build(ims, lbs, 3, 2, fmt, None, {})
    assert serial[1] == pooled[1] and serial[2] == pooled[2] and 250 < len(serial[0]["im_files"]) < 300
    assert serial[0]["im_files"] == pooled[0]["im_files"]
    for k in ("shapes", "inst", "cls", "bboxes", "has_extra", "extra_ends", "extra"):
        assert serial[0][k].tobytes() == pooled[0][k].tobytes(), k



def test_pool_scan_runs_in_other_processes(tmp_path, monkeypatch):
    """Large splits are checked by forked processes, CHUNK images at a time."""
    f = _jpeg(tmp_path / "a.jpg")
    n = 4 * labels_mod.CHUNK
    verify = labels_mod.verify_image_label
    monkeypatch.setattr(labels_mod, "verify_image_label", lambda *a: dict(verify(*a), pid=os.getpid()))
    records = labels_mod._records([str(f)] * n, [str(tmp_path / "a.txt")] * n, 1, 2, DetectLabels(), None, {}, "")
    pids = {r["pid"] for r in records}
    assert len(records) == n and os.getpid() not in pids and 1 <= len(pids) <= 2
