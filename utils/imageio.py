"""Image files and drawn text through OpenCV, for any file name.

OpenCV takes file names and text as C strings. A name that is not valid UTF-8 (a Latin-1 'café.jpg' from an old
archive, which Python holds as surrogate escapes) crashes the process inside cv2, a segmentation fault rather than an
exception; so every cv2 call given a file name or a text that may hold one goes through here.
"""

from pathlib import Path

import cv2
import numpy as np


def is_utf8(text):
    """Whether `text` encodes as UTF-8 (False for a non-UTF-8 file name held as surrogate escapes)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable(text):
    """`text` with the bytes of a non-UTF-8 file name written as escapes ('caf\\xe9.jpg'): safe to draw or print."""
    return str(text).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_image(path):
    """BGR uint8 image (EXIF orientation applied, grey/RGBA/16-bit converted by OpenCV), or None if undecodable.

    cv2.imread stays the rule because only it also decodes a truncated JPEG (as far as the data goes); a name it
    cannot take is read by Python and decoded from memory."""
    path = str(path)
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
