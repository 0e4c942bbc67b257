"""Image files and drawn text through OpenCV, for any file name; an image's size read from its header before it is
decoded.

OpenCV takes file names and text as C strings. A name that is not valid UTF-8 (a Latin-1 'café.jpg' from an old
archive, which Python holds as surrogate escapes) crashes the process inside cv2, a segmentation fault rather than an
exception; so every cv2 call given a file name or a text that may hold one goes through here.

A 600-byte JPEG can declare 20000 x 20000 pixels, which OpenCV allocates (1.2 GB) before it finds the data missing:
`read_image` reads the size the header declares first, without decoding (`header_size`), and refuses an image over
MAX_IMAGE_PIXELS (PIL's decompression-bomb limit, utils/budget.py) with ImageTooLarge, a named reason the callers
report as a skip. Only regular files are opened: a FIFO named x.jpg would block the reader forever.
"""

import os
import stat
import struct
from pathlib import Path

import cv2
import numpy as np

from utils.budget import MAX_IMAGE_HEADER_BYTES, MAX_IMAGE_PIXELS
from utils.errors import BadFile
from utils.text import escape_controls


class ImageTooLarge(BadFile):
    """An image whose header declares more than MAX_IMAGE_PIXELS pixels (a decompression bomb, or a scan far beyond
    what a detector reads)."""


class NotAFile(BadFile):
    """An image path that is not a regular file (a FIFO, a device, a socket, a folder)."""


def is_utf8(text):
    """Whether `text` encodes as UTF-8 (False for a non-UTF-8 file name held as surrogate escapes)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable(text):
    """`text` with the bytes of a non-UTF-8 file name and its control characters written as escapes ('caf\\xe9.jpg',
    'a\\x1b[2J.jpg'): safe to draw or print."""
    return escape_controls(str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


# ------------------------------------------------------------------------------------------------ header sizes
def _jpeg(head):
    """(w, h) from the first frame header (SOFn) of a JPEG, walking its markers."""
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        length = struct.unpack(">H", head[i + 2:i + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", head[i + 5:i + 9])
            return w, h
        i += 2 + length
    return None


def _tiff(head):
    """(w, h) of a TIFF's first image (the one OpenCV reads): tags 256 and 257 of its first directory."""
    order = "<" if head[:2] == b"II" else ">"
    (ifd,) = struct.unpack(order + "I", head[4:8])
    if ifd + 2 > len(head):
        return None
    (n,) = struct.unpack(order + "H", head[ifd:ifd + 2])
    size = {}
    for k in range(min(n, (len(head) - ifd - 2) // 12)):
        tag, kind, _, value = struct.unpack(order + "HHI4s", head[ifd + 2 + 12 * k:ifd + 14 + 12 * k])
        if tag in (256, 257):
            if tag in size:  # libtiff keeps the first of two, a bomb's size; the second would pass for the image's
                return None
            size[tag] = struct.unpack(order + ("H" if kind == 3 else "I"), value[:2 if kind == 3 else 4])[0]
    return (size[256], size[257]) if len(size) == 2 else None


def _netpbm(head):
    """(w, h) from a PNM or PFM text header: magic, then width and height (comments after '#')."""
    words = []
    for line in head.split(b"\n")[:16]:
        words += line.split(b"#")[0].split()
        if len(words) >= 3:
            return int(words[1]), int(words[2])
    return None


def _webp(head):
    chunk = head[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        b = int.from_bytes(head[21:25], "little")
        return (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def _size(head):
    """(w, h) a header declares, None where it is no image format OpenCV and this reader know."""
    if head[:2] == b"\xff\xd8":
        return _jpeg(head)
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return struct.unpack(">II", head[16:24])
    if head[:2] == b"BM":  # a 12-byte OS/2 header holds 16-bit sizes, the others 32-bit
        w, h = struct.unpack("<HH", head[18:22]) if head[14] == 12 else struct.unpack("<ii", head[18:26])
        return abs(w), abs(h)
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return _tiff(head)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return struct.unpack("<HH", head[6:10])
    if head[:1] == b"P" and head[1:2] in b"123456fF" and len(head) > 2 and head[2:3].isspace():
        return _netpbm(head)
    return None


def _open_regular(path):
    """A read-only descriptor of `path`, NotAFile unless it is a regular file (opened without blocking, so a FIFO is
    named rather than waited on)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAFile("not a regular file (a FIFO, device, socket or folder)")
    return fd


def header_size(path):
    """(w, h) that the image file `path` declares, read from its first bytes (at most MAX_IMAGE_HEADER_BYTES) without
    decoding; None where its header is not one this reader knows, or is cut short. NotAFile for anything but a
    regular file."""
    with os.fdopen(_open_regular(path), "rb") as f:
        head = f.read(1 << 16)
        size = _parse(head)
        if size is None and len(head) == 1 << 16:  # markers before a JPEG's frame header: EXIF, ICC profiles
            head += f.read(MAX_IMAGE_HEADER_BYTES - len(head))
            size = _parse(head)
    return size


def _parse(head):
    try:
        return _size(head)
    except (struct.error, ValueError):
        return None


def check_pixels(w, h, what=""):
    """ImageTooLarge when a w x h image or frame is over MAX_IMAGE_PIXELS; `what` starts the message (the caller may
    name the file there, or where the message goes)."""
    if w * h > MAX_IMAGE_PIXELS:
        raise ImageTooLarge(f"{what}{w}x{h} = {w * h} pixels, over the {MAX_IMAGE_PIXELS}-pixel limit (a "
                            "decompression bomb, or a scan to tile first)")


def read_image(path):
    """BGR uint8 image (EXIF orientation applied, grey/RGBA/16-bit converted by OpenCV), or None if undecodable or
    of a kind whose size no header says. ImageTooLarge / NotAFile (BadFile, a ValueError) for an image whose header
    declares more than MAX_IMAGE_PIXELS or a path that is no regular file, before anything is decoded; the caller
    names the file.

    cv2.imread stays the rule because only it also decodes a truncated JPEG (as far as the data goes); a name it
    cannot take is read by Python and decoded from memory."""
    path = str(path)
    try:
        size = header_size(path)
    except OSError:
        return None
    if size is None:
        return None
    check_pixels(*size)
    try:
        if is_utf8(path):
            return cv2.imread(path, cv2.IMREAD_COLOR)
        data = np.fromfile(path, np.uint8)
        return cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except (OSError, ValueError, cv2.error):
        return None


def write_image(path, im):
    """cv2.imwrite for any file name: one OpenCV cannot take is encoded in memory and written by Python."""
    path = str(path)
    if is_utf8(path):
        return cv2.imwrite(path, im)
    ok, buf = cv2.imencode(Path(path).suffix if is_utf8(Path(path).suffix) else ".jpg", im)
    if ok:
        buf.tofile(path)
    return ok
