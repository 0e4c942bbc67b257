"""An image's size read from its header before it is decoded (utils/imageio.py): the size OpenCV decodes for every
format it writes, a bomb's declared size refused before a pixel is allocated, only regular files opened, and text
escaped for printing."""

import os
import struct
import subprocess
import sys

import cv2
import numpy as np
import pytest

from utils.budget import MAX_IMAGE_PIXELS
from utils.files import ROOT
from utils.imageio import ImageTooLarge, NotAFile, header_size, printable, read_image


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".tif", ".webp", ".pgm", ".ppm", ".pbm", ".pfm"])
def test_the_header_says_the_size_opencv_decodes(tmp_path, ext):
    im = (np.random.default_rng(0).random((37, 53, 3)) * 255).astype(np.uint8)
    if ext == ".pfm":
        im = im.astype(np.float32) / 255
    path = tmp_path / f"a{ext}"
    assert cv2.imwrite(str(path), im[..., 0] if ext in (".pgm", ".pbm") else im)
    decoded = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert header_size(path) == (decoded.shape[1], decoded.shape[0]) == (53, 37)


def _jpeg_declaring(w, h):
    """A JPEG cut short after its frame header, which declares w x h (the issue's 629-byte file: OpenCV allocates the
    declared size before it finds the data missing)."""
    ok, buf = cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))
    data = bytearray(buf.tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", h, w)
    return bytes(data[:sof + 19 + 600])


def _headers(w, h):
    """Headers of every kind this reader knows declaring w x h, each a few hundred bytes."""
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", w, h) + bytes(200)
    bmp = b"BM" + bytes(12) + struct.pack("<Iii", 40, w, h) + bytes(200)
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 2) + struct.pack("<HHII", 256, 4, 1, w) + \
        struct.pack("<HHII", 257, 4, 1, h) + bytes(100)
    webp = b"RIFF" + bytes(4) + b"WEBPVP8X" + bytes(8) + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
    return {"jpeg": _jpeg_declaring(w, h), "png": png, "bmp": bmp, "tiff": tiff, "webp": webp + bytes(100),
            "gif": b"GIF89a" + struct.pack("<HH", w, h) + bytes(100), "ppm": f"P6\n{w} {h}\n255\n".encode() + bytes(99)}


@pytest.mark.parametrize("kind", list(_headers(1, 1)))
def test_a_bomb_is_refused_before_anything_is_decoded(tmp_path, kind, monkeypatch):
    """20000 x 20000 declared in a few hundred bytes: refused by its header, OpenCV never called. The limit is PIL's
    decompression-bomb limit: 9459 x 9459 is inside it, 9460 x 9460 not."""
    monkeypatch.setattr(cv2, "imread", lambda *a: pytest.fail("decoded"))
    for (w, h), refused in [((20000, 20000), True), ((9460, 9460), True), ((9459, 9459), False)]:
        path = tmp_path / f"a.{kind}"
        path.write_bytes(_headers(w, h)[kind])
        assert header_size(path) == (w, h) and (w * h > MAX_IMAGE_PIXELS) == refused
        if refused:
            with pytest.raises(ImageTooLarge, match=rf"{w}x{h} = {w * h} pixels, over the 89478485-pixel limit"):
                read_image(path)


def test_a_coco_sized_image_is_read(tmp_path):
    path = tmp_path / "000000000139.jpg"
    cv2.imwrite(str(path), np.full((426, 640, 3), 90, np.uint8))
    assert header_size(path) == (640, 426) and read_image(path).shape == (426, 640, 3)


def test_a_header_this_reader_does_not_know_is_undecodable(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(b"\x00\x00\x00\x0cjP  \r\n\x87\n" + bytes(100))  # JPEG 2000: no size this reader knows
    assert header_size(path) is None and read_image(path) is None


def test_only_regular_files_are_opened(tmp_path):
    """A FIFO named like an image would block the reader until someone writes to it: refused at once (a process with
    a timeout, so that a regression fails instead of hanging the suite)."""
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    code = "import sys\nfrom utils.imageio import read_image\ntry:\n    read_image(sys.argv[1])\n" \
           "except Exception as e:\n    print(type(e).__name__, e)\n"
    r = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.stdout.strip() == "NotAFile not a regular file (a FIFO, device, socket or folder)", r.stderr
    with pytest.raises(NotAFile):
        read_image(tmp_path)


def test_printable_text_cannot_drive_a_terminal():
    name = "a\x1b]0;pwned\x07\x1b[2J\rAll checks passed\ncaf\udce9.jpg"
    shown = printable(name)
    assert shown == "a\\x1b]0;pwned\\x07\\x1b[2J\\rAll checks passed\\ncaf\\xe9.jpg"
    assert shown.isprintable()


def test_a_tiff_that_names_its_size_twice_is_undecodable(tmp_path):
    """A 198-byte TIFF whose first width and height tags say 20000 and whose second say 8: libtiff (OpenCV) takes
    the first, this reader took the last and let a 400-megapixel bomb through as 8 x 8."""
    tags = [struct.pack("<HHII", tag, 4, 1, v) for tag, v in ((256, 20000), (256, 8), (257, 20000), (257, 8))]
    f = tmp_path / "twice.tif"
    f.write_bytes(b"II*\x00" + struct.pack("<IH", 8, len(tags)) + b"".join(tags) + bytes(4))
    assert header_size(f) is None and read_image(f) is None
