"""A JPEG's verdict for the label scan from its markers and its last two bytes, without decoding its pixels.

Decoding a photo in full costs about 3 ms (COCO's 640 x 480 JPEGs), twenty times what the rest of its scan costs;
what the scan needs from it is its upright size and whether OpenCV will decode it. For a JPEG whose structure is
ordinary, both are read from the header: libjpeg stops only on errors in the markers before the first scan (an
unknown frame type, a quantisation table used and never defined, a bad length) and decodes damaged entropy-coded
data as far as it goes, with a warning. So `plain_jpeg_size` walks those markers and answers only where it is sure:
a baseline, extended or progressive 8-bit frame of 1 or 3 components, every quantisation table it uses defined,
at most one EXIF block with a readable orientation, and the end-of-image marker in the file's last two bytes (a
truncated JPEG is decoded as before: it keeps or loses its image by how much of it survives). Anything else, PNGs
and every other format among them, gets None and is decoded as before, so the verdicts are the decoder's in every
case (tests/data/test_scan_speed.py checks the sizes against cv2.imread, EXIF orientations included).
"""

import os
import stat
import struct

HEAD_BYTES = 1 << 16  # the first read: the markers before a photo's first scan, EXIF thumbnail included
MAX_HEAD_BYTES = 1 << 20  # EXIF and ICC blocks beyond this are rare enough to decode instead
FRAMES = (0xC0, 0xC1, 0xC2)  # baseline, extended sequential, progressive (Huffman); lossless and arithmetic: decode
SWAPS = (5, 6, 7, 8)  # EXIF orientations that turn the stored image by 90 degrees: width and height swap


def _orientation(exif):
    """The orientation tag (0x0112) of the TIFF structure after 'Exif\\0\\0' (1 where it has none), None where the
    structure cannot be read or the value is not one of the eight orientations."""
    try:
        order = {b"II": "<", b"MM": ">"}[exif[:2]]
        (ifd,) = struct.unpack(order + "I", exif[4:8])
        (n,) = struct.unpack(order + "H", exif[ifd:ifd + 2])
        for k in range(n):
            tag, kind, count = struct.unpack(order + "HHI", exif[ifd + 2 + 12 * k:ifd + 10 + 12 * k])
            if tag == 0x0112:
                if kind != 3 or count != 1:
                    return None
                (value,) = struct.unpack(order + "H", exif[ifd + 10 + 12 * k:ifd + 12 + 12 * k])
                return value if 1 <= value <= 8 else None
    except (KeyError, struct.error):
        return None
    return 1


def _frame(head, i, length, tables):
    """(w, h) of the frame header at head[i] when it is one decoded as usual, else None."""
    if length < 8:
        return None
    precision, h, w, n = struct.unpack(">BHHB", head[i + 4:i + 10])
    if precision != 8 or n not in (1, 3) or not h or not w or length != 8 + 3 * n:
        return None
    for c in range(n):
        sampling, table = head[i + 11 + 3 * c], head[i + 12 + 3 * c]
        if not (1 <= sampling >> 4 <= 4 and 1 <= sampling & 15 <= 4) or table not in tables:
            return None
    return w, h


def _quant_tables(head, i, length):
    """The ids of the quantisation tables a DQT segment defines; None where its length does not add up."""
    ids, j, end = set(), i + 4, i + 2 + length
    while j < end:
        precision, tid = head[j] >> 4, head[j] & 15
        if precision > 1 or tid > 3:
            return None
        ids.add(tid)
        j += 1 + 64 * (precision + 1)
    return ids if j == end else None


def _walk(head):
    """(w, h, orientation) read from the markers up to the first scan, None where any is unusual or cut off."""
    i, tables, size, orientation = 2, set(), None, 1
    exif_blocks = 0
    while i + 4 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # a fill byte
            i += 1
            continue
        (length,) = struct.unpack(">H", head[i + 2:i + 4])
        if length < 2 or i + 2 + length > len(head):
            return None
        if marker == 0xDA:  # start of scan: the header ends here
            return None if size is None else (*size, orientation)
        if marker == 0xDB:
            ids = _quant_tables(head, i, length)
            if ids is None:
                return None
            tables |= ids
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in FRAMES or size is not None:
                return None
            size = _frame(head, i, length, tables)
            if size is None:
                return None
        elif marker == 0xE1 and head[i + 4:i + 10] == b"Exif\x00\x00":
            exif_blocks += 1
            orientation = _orientation(head[i + 10:i + 2 + length])
            if exif_blocks > 1 or orientation is None:
                return None
        elif not (0xE0 <= marker <= 0xEF or marker in (0xC4, 0xDD, 0xFE)):  # APPn, DHT, DRI, COM
            return None
        i += 2 + length
    return None


def plain_jpeg_size(path):
    """(h, w) upright (EXIF orientation applied) of a JPEG that OpenCV decodes whole, read from its header and its
    last two bytes; None where that cannot be told without decoding (not a JPEG, truncated, or anything unusual).
    OSError as `open` raises it; a path that is no regular file gets None (the decoder's path names it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < 4:
            return None
        head = f.read(HEAD_BYTES)
        if head[:3] != b"\xff\xd8\xff":
            return None
        found = _walk(head)
        if found is None and len(head) == HEAD_BYTES:
            head += f.read(MAX_HEAD_BYTES - HEAD_BYTES)
            found = _walk(head)
        if found is None:
            return None
        f.seek(-2, os.SEEK_END)
        if f.read(2) != b"\xff\xd9":
            return None
    w, h, orientation = found
    return (w, h) if orientation in SWAPS else (h, w)
