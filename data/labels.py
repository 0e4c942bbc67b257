"""Verifying YOLO-format images and label files, and the label cache that saves doing it twice.

A label line is `cls` followed by what the task's label format reads (data/label_formats.py: a box
`cx cy w h` or a polygon `x1 y1 x2 y2 ...` for detect and segment), normalised to [0, 1]. The policy for what is
skipped, kept or fixed is in `verify_image_label`.
"""

import contextlib
import functools
import itertools
import multiprocessing
import os
import re
import signal
import sys
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from data.image_files import MISSING, entry_problem, files_hash
from data.jpeg_header import plain_jpeg_size
from data.label_cache import SUFFIX, load_cache, save_cache
from data.label_formats import BadLine, get_format
from data.label_store import check_packed, pack_records
from utils import dist as du
from utils.budget import MAX_LABEL_BYTES
from utils.errors import BadDataset
from utils.imageio import check_pixels, read_image
from utils.log import LOGGER
from utils.text import escape_controls

CACHE_VERSION = "yolo-labels-6"  # 3: label paths that are not files, BOMs, strict numbers, zero-area polygons;
# 4: images skipped for a class id >= nc counted apart (`unknown_class`); 5: annotated images not found (`absent`);
# 6: the labels packed in a few arrays (data/label_store.pack_records)
MAX_WARNINGS = 10  # problems printed per scan; all of them are in the dataset's `problems` (and the run folder)
MAX_LINES = 3  # bad lines named per skipped image
MIN_SIDE = 10  # pixels
CHUNK = 64  # images a scanning process checks per task: ~10 ms of work against ~0.1 ms to hand it on
BAR = "{l_bar}{bar:10}{r_bar}"
# left_out: objects the annotation format itself says to leave out (COCO crowd, VOC difficult: data/annotations)
# absent: images an annotation file lists that the split does not hold (AnnotationSource.absent)
STAT_KEYS = ("images", "backgrounds", "skipped", "duplicates", "clipped", "truncated", "unlabelled", "left_out",
             "unknown_class", "absent")
# Python's float() also reads '1_000', '٣' (other scripts' digits) and surrounding text forms: a label value must be
# plain decimal notation, and a class id decimal digits, optionally with a zero fraction ('1', '1.0')
DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
CLASS_ID = re.compile(r"\d+(\.0*)?", re.ASCII)
PLAIN_TEXT = re.compile(r"[0-9eE.+\-\s]*")  # the characters of label text that `_plain_rows` reads at once


def verify_image(path):
    """(h, w) of a readable image, or raise ValueError saying what is wrong."""
    return _image_shape(path)[0]


def _image_shape(path):
    """((h, w), whole?) of a readable image, or raise ValueError saying what is wrong. whole: a JPEG read from its
    header and tail (data/jpeg_header.py), known to hold its end-of-image marker; False for an image decoded."""
    why = entry_problem(path)
    if why:
        raise ValueError("image file missing" if why == MISSING else f"image path {why}")
    if os.path.getsize(path) == 0:
        raise ValueError("image file is empty (0 bytes)")
    try:
        shape, whole = plain_jpeg_size(path), True
    except OSError:  # the decoder's path below names it as before
        shape = None
    if shape is not None:
        check_pixels(shape[1], shape[0])  # the limit read_image applies before decoding
    else:
        im, whole = read_image(path), False
        if im is None:
            raise ValueError("not a readable image (cannot be decoded)")
        shape = im.shape[:2]
    h, w = shape
    if h < MIN_SIDE or w < MIN_SIDE:
        raise ValueError(f"image size {w}x{h} is under {MIN_SIDE} pixels")
    return (h, w), whole


def jpeg_truncated(path):
    """True for a JPEG without its end-of-image marker (a partial download or copy). Judged by the content, not the
    name: a PNG saved as .jpg is decoded as the PNG it is and has no JPEG marker to lack."""
    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":
            return False
        f.seek(-2, 2)
        return f.read() != b"\xff\xd9"


class UnknownClass(BadLine):
    """A class id >= nc: the label may be right and the dataset's `names` short (YOLODataset's `names_from`)."""


def _parse_line(values, nc, fmt):
    """One label line split in words -> (cls, box xywhn, extra, clipped?); raises BadLine saying why."""
    try:
        v = np.array([float(x) for x in values], dtype=np.float64)
    except ValueError:
        raise BadLine("non-numeric value") from None
    if not np.isfinite(v).all():
        raise BadLine("non-finite value (nan or inf)")
    odd = next((x for x in values if not DECIMAL.fullmatch(x)), None)
    if odd is not None:
        raise BadLine(f"value {odd!r} is not a plain decimal number")
    if not CLASS_ID.fullmatch(values[0]):
        hint = " in decimal digits (e.g. 1 or 1.0)" if v[0] >= 0 and v[0] == np.floor(v[0]) else ""
        raise BadLine(f"class {values[0]} is not a non-negative integer{hint}")
    if nc is not None and v[0] >= nc:
        raise UnknownClass(f"class {int(v[0])} >= nc {nc}")
    box, extra, clipped = fmt.parse(v[1:])
    return int(v[0]), box, extra, clipped


def read_label_bytes(lb_file):
    """The bytes of a label or annotation file: None when there is none (a background image); BadLine when the path is
    not a readable regular file (a folder, a dangling symlink: never taken for an empty label; a FIFO would block the
    reader forever) or it is larger than MAX_LABEL_BYTES (read no further)."""
    why = entry_problem(lb_file)
    if why == MISSING:
        return None
    if why:
        raise BadLine(f"label path {lb_file} {why}")
    with open(lb_file, "rb") as f:  # its apparent size, not its disk blocks: a sparse file reads as its holes' zeros
        data = f.read(MAX_LABEL_BYTES + 1)
    if len(data) > MAX_LABEL_BYTES:
        raise BadLine(f"{lb_file}: larger than {MAX_LABEL_BYTES} bytes, more than any label file holds")
    return data


def read_label_text(lb_file):
    """The text of a label file (read_label_bytes); BadLine when its bytes are not UTF-8. A UTF-8 byte order mark,
    which some Windows editors write, is dropped."""
    data = read_label_bytes(lb_file)
    if data is None:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadLine(f"{lb_file}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


@functools.cache
def _reads_plain(kind):
    """Whether the format class's `parse_plain` was written with the `parse` it uses: a format that reads lines its
    own way but inherits another's `parse_plain` is read line by line."""
    mro = kind.__mro__
    return next(k for k in mro if "parse" in vars(k)) is next(k for k in mro if "parse_plain" in vars(k))


def _plain_rows(text, nc, fmt):
    """The record fields of a label text whose every line is an ordinary one of its format (plain decimals, class
    < nc, geometry inside the image, no two rows alike), parsed for all lines at once by the format's
    `parse_plain`; None for any other text, which `parse_label_file` then reads line by line as before (and names
    what is wrong). Every value is converted by float() as there, and the geometry comes out of the same float64
    operations, so the results are bit-identical. Over ASCII digits, '.', '+', '-', 'e' and 'E', float() accepts
    exactly the DECIMAL notation."""
    if not PLAIN_TEXT.fullmatch(text) or not _reads_plain(type(fmt)):
        return None
    rows = [r for r in (line.split() for line in text.splitlines()) if r]
    if not rows or any(not CLASS_ID.fullmatch(r[0]) for r in rows):
        return None
    try:
        flat = np.array(list(map(float, itertools.chain.from_iterable(rows))), dtype=np.float64)
    except ValueError:
        return None
    widths = np.array([len(r) for r in rows])
    if (widths == widths[0]).all():  # lines of one length (boxes, keypoints, corners): a table
        table = flat.reshape(len(rows), -1)
        classes, coords = table[:, 0], table[:, 1:].reshape(-1)
    else:
        first = np.cumsum(widths) - widths  # each line's class
        classes, coords = flat[first], np.delete(flat, first)
    if not np.isfinite(flat).all() or (nc is not None and classes.max() >= nc):
        return None
    parsed = fmt.parse_plain(coords, widths - 1)
    if parsed is None:
        return None
    boxes, extras, clipped = parsed
    classes = classes.astype(int)
    boxed = [(c, *b) for c, b in zip(classes.tolist(), np.round(boxes, 6).tolist())]
    # rows alike have the same class and box; only then are their extras compared (as the line-by-line key does)
    if len(set(boxed)) < len(rows) and len({(*k, None if e is None else np.round(e, 6).tobytes())
                                            for k, e in zip(boxed, extras)}) < len(rows):
        return None  # duplicate rows: removed and noted line by line
    fields = {"cls": classes.astype(np.float32).reshape(-1, 1), "bboxes": boxes, fmt.extra_key: extras}
    return fields, int(clipped.sum())


def parse_label_file(lb_file, nc, fmt, converted=None):
    """Parse one label file -> (record fields, counts, notes). Raises BadLine naming the bad line(s), UnknownClass
    where a class id >= nc is among them. converted: the (text, where, row) of labels converted from annotations
    instead (data/annotations.py): lines named as the `row`s of `where`."""
    classes, boxes, extras, notes, seen, bad, unknown = [], [], [], [], set(), [], False
    text, where, row = converted if converted else (read_label_text(lb_file), lb_file, "line")
    counts = {"duplicates": 0, "clipped": 0, "unlabelled": int(text is None)}
    plain = None if converted or not text else _plain_rows(text, nc, fmt)
    if plain is not None:
        counts["clipped"] = plain[1]
        return plain[0], counts, notes
    for i, line in enumerate((text or "").splitlines(), 1):
        values = line.split()
        if not values:
            continue
        try:
            c, box, extra, clipped = _parse_line(values, nc, fmt)
        except BadLine as e:
            bad.append(f"{row} {i}: {e}")
            unknown = unknown or isinstance(e, UnknownClass)
            continue
        key = (c, *np.round(box, 6).tolist(), None if extra is None else np.round(extra, 6).tobytes())
        if key in seen:
            counts["duplicates"] += 1
            notes.append(f"duplicate {'row' if row == 'line' else row} {i} removed")
            continue
        seen.add(key)
        counts["clipped"] += clipped
        classes.append(c)
        boxes.append(box)
        extras.append(extra)
    if bad:
        more = f"; ... {len(bad) - MAX_LINES} more bad lines" if len(bad) > MAX_LINES else ""
        raise (UnknownClass if unknown else BadLine)(f"{where} {'; '.join(bad[:MAX_LINES])}{more}")
    fields = {"cls": np.array(classes, dtype=np.float32).reshape(-1, 1),
              "bboxes": np.array(boxes, dtype=np.float32).reshape(-1, 4), fmt.extra_key: extras}
    return fields, counts, notes


def verify_image_label(im_file, lb_file, nc=None, fmt="detect", source=None, names=None):
    """Check one image and its label file; returns a record dict with `skipped` ('' or the reason) and `msg`
    ('' or one warning line naming the image). source: the split's AnnotationSource (COCO, VOC) when its labels are
    not YOLO text files; they are converted into label lines for `names` ({id: name}) and checked as these.

    Policy (as the official repos, and so that no object on a kept image is trained as background):
    - a label file with any bad line (wrong number of values, non-numeric, nan/inf, a value not in plain decimal
      notation such as `0_5`, class not decimal digits in [0, nc) (`1.0` is class 1), coordinates outside [0, 1] by
      more than 1 %, zero-size box, polygon of < 3 points or of zero area, not UTF-8): the image is skipped whole,
      and the reason names the file and the line(s); a UTF-8 byte order mark at the start is dropped;
    - a label path that is not a readable regular file (a folder, a dangling symlink, a symlink loop, a pipe): the
      image is skipped, never taken as a background;
    - an empty or missing label file: the image is kept as a background;
    - duplicate rows: dropped with a note, the image is kept;
    - coordinates outside [0, 1] by at most 1 % (exporter rounding): clipped and counted, the image is kept;
    - grey, RGBA, 16-bit and EXIF-rotated images: converted by the reader to 8-bit BGR upright, kept;
    - a truncated JPEG: kept as decoded when it decodes (with a note), else skipped; images are decoded by their
      content, so a PNG named .jpg is read as a PNG (and is not a truncated JPEG);
    - missing, empty (0 bytes), undecodable (including files that are not images) or < 10 pixel images, and image
      paths that are folders, dangling symlinks or symlink loops: skipped with that reason.
    """
    fmt = get_format(fmt)
    rec = {"im_file": im_file, "shape": None, "skipped": "", "duplicates": 0, "clipped": 0, "truncated": 0,
           "unlabelled": 0, "left_out": 0, "unknown_class": 0, "msg": ""}
    try:
        rec["shape"], whole = _image_shape(im_file)
        converted, left = None, ([], {})
        if source is not None:
            text, *left = source.read(im_file, lb_file, rec["shape"], names, fmt)
            converted = (text, f"{lb_file} ({Path(im_file).name})", source.row)
        fields, counts, notes = parse_label_file(lb_file, nc, fmt, converted)
    except (ValueError, OSError) as e:  # BadLine is a ValueError
        rec.update(skipped=str(e), msg=f"{im_file}: skipped, {e}", unknown_class=int(isinstance(e, UnknownClass)))
        return rec
    notes += left[0]
    counts.update(left[1])
    if not whole and jpeg_truncated(im_file):
        rec["truncated"] = 1
        notes.insert(0, "truncated JPEG, kept as decoded")
    rec.update(counts, **fields)
    if notes:
        shown = "; ".join(notes[:5]) + (f"; ... {len(notes) - 5} more" if len(notes) > 5 else "")
        rec["msg"] = f"{im_file}: kept, {shown}"
    return rec


_job = None  # (nc, fmt, source, names) of the scan a forked scanning process serves


def _scan_chunk(pairs):
    """In a scanning process: the records of a chunk of (image, label file) pairs."""
    nc, fmt, source, names = _job
    return [verify_image_label(im, lb, nc, fmt, source, names) for im, lb in pairs]


def _forked_pool(workers):
    """A pool of `workers` processes forked from this one (they inherit the scan's arguments, never pickled), or
    None where forking is not how processes start here or this process may not have children (a loader worker)."""
    if workers < 2 or sys.platform != "linux" or multiprocessing.current_process().daemon:
        return None
    return multiprocessing.get_context("fork").Pool(workers, initializer=_scanner_start)


def _scanner_start():
    """A forked scanning process: OpenCV at one thread, and the signals as a plain process has them. It would
    otherwise keep the training's handlers (engine/interrupt.py): the pool's terminate() sends SIGTERM, which the
    inherited handler turned into an exception inside the worker's read of the task queue, and a worker that died
    holding that queue's lock left its siblings, and the training waiting on them, blocked for ever (one fresh scan
    in six hung). Ctrl-C is the parent's to handle: it stops the pool."""
    cv2.setNumThreads(0)
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _records(im_files, label_files, nc, workers, fmt, source, names, desc):
    """verify_image_label's record of every image, in order: in `workers` forked processes for a large split (the
    checks are Python and hold the GIL; a decode fallback is OpenCV at one thread each), with a progress bar and its
    rate. Each process takes chunks of CHUNK images, so the cost per image does not depend on the split's size."""
    global _job
    pairs = list(zip(im_files, label_files))
    _job = nc, fmt, source, names  # before the fork: the processes inherit it
    pool = _forked_pool(workers) if len(pairs) >= 2 * CHUNK else None
    if pool is None:
        _job = None
        return [verify_image_label(im, lb, nc, fmt, source, names) for im, lb in pairs]
    try:
        chunks = pool.imap(_scan_chunk, (pairs[i:i + CHUNK] for i in range(0, len(pairs), CHUNK)))
        records = []
        with tqdm(total=len(pairs), desc=desc, unit="img", mininterval=1.0, bar_format=BAR) as bar:
            for chunk in chunks:
                records += chunk
                bar.update(len(chunk))
                du.progress(len(chunk))  # keeps the ranks waiting for this scan waiting (utils/dist.py)
        return records
    finally:
        _job = None
        pool.terminate()


def _build(im_files, label_files, nc, workers, fmt, source, names, desc=""):
    if source is not None:
        source.prepare()
    records = _records(im_files, label_files, nc, workers, fmt, source, names, desc)
    stats = {**{k: 0 for k in STAT_KEYS}, "first_unknown_class": ""}
    labels, skipped, notes = [], [], []
    if source is not None:
        notes = [f"{entry}: ignored, {why}" for entry, why in source.absent(im_files)]
        stats["absent"] = len(notes)
    for r in records:
        if r["skipped"]:
            stats["skipped"] += 1
            stats["unknown_class"] += r["unknown_class"]  # skipped images with a class id >= nc among their lines
            if r["unknown_class"] and not stats["first_unknown_class"]:
                stats["first_unknown_class"] = r["msg"]
            skipped.append(r["msg"])
            continue
        for k in ("duplicates", "clipped", "truncated", "unlabelled", "left_out"):
            stats[k] += r[k]
        if r["msg"]:
            notes.append(r["msg"])
        stats["images"] += 1
        stats["backgrounds"] += len(r["cls"]) == 0
        labels.append(r)
    return pack_records(labels, fmt.extra_key, fmt.extra_width), stats, skipped + notes


def cache_labels(im_files, label_files, cache_path, nc=None, prefix="", workers=8, fmt="detect", source=None,
                 names=None):
    """Load the label cache or rebuild it; log one summary line plus the first problems. Returns (labels, stats).
    source, names: as verify_image_label's (the converted labels depend on the format and the names too).

    `labels` holds the kept images packed (data/label_store.pack_records): their im_files, shapes (h, w),
    classes (M, 1), boxes (M, 4) xywhn and the label format's per-instance extras (segments: polygons (k, 2)
    normalised, none for box-only lines), which `LabelStore.from_scan` turns into the dataset's labels.
    `stats` counts STAT_KEYS, says whether the cache was used, and lists every problem (`problems`).
    """
    fmt = get_format(fmt)
    converted = f" {source.kind} {fmt.name} {sorted(names.items())}" if source is not None else ""
    files = [*im_files, *dict.fromkeys(label_files)] if source is not None else [*im_files, *label_files]
    hash_ = files_hash(files, extra=f"{CACHE_VERSION} nc={nc} {fmt.line_format}{converted}")
    members = set(im_files)

    def valid(data):
        check_packed(data["labels"], fmt.extra_width)
        return all(f in members for f in data["labels"]["im_files"])

    cache = load_cache(cache_path, hash_, prefix, valid=valid)
    cached = cache is not None
    if not cached:
        labels, stats, msgs = _build(im_files, label_files, nc, min(workers, os.cpu_count() or 1), fmt, source, names,
                                     f"{prefix}Scanning {str(cache_path).removesuffix(SUFFIX)}")
        cache = {"version": CACHE_VERSION, "hash": hash_, "labels": labels, "stats": stats, "msgs": msgs}
        save_cache(cache_path, cache, hash_, prefix)
    s, msgs = cache["stats"], cache["msgs"]
    LOGGER.info(
        f"{prefix}Scanning {str(cache_path).removesuffix(SUFFIX)}... {s['images']} images ({s['backgrounds']} "
        f"backgrounds), {s['skipped']} skipped, {s['duplicates']} duplicate rows removed, {s['clipped']} labels "
        f"clipped, {s['truncated']} truncated JPEGs" + (f", {s['left_out']} objects left out as {source.kind} says"
                                                        if s.get("left_out") else "") + (" (cached)" if cached else "")
    )
    log_problems(msgs, s["skipped"], prefix)
    if s["images"] and s["unlabelled"] == s["images"] and source is not None:
        LOGGER.warning(f"{prefix}WARNING: {source.kind} {label_files[0]} labels none of the {s['images']} images (e.g. "
                       f"{Path(im_files[0]).name}); every image is trained as a background")
    elif s["images"] and s["unlabelled"] == s["images"]:  # labels in the wrong folder, the commonest set-up mistake
        LOGGER.warning(f"{prefix}WARNING: not one of the {s['images']} images has a label file (e.g. {label_files[0]} "
                       f"for {im_files[0]}: the last /images/ of an image path becomes /labels/ and its suffix .txt); "
                       "every image is trained as a background")
    return cache["labels"], dict(s, cached=cached, problems=list(msgs))


def log_problems(msgs, n_skipped, prefix=""):
    """Warn with the number of skipped images and the first MAX_WARNINGS problems."""
    if n_skipped:
        LOGGER.warning(f"{prefix}WARNING: {n_skipped} images skipped (first reasons below)")
    for m in msgs[:MAX_WARNINGS]:
        LOGGER.warning(f"{prefix}WARNING: {escape_controls(m)}")
    if len(msgs) > MAX_WARNINGS:
        LOGGER.warning(f"{prefix}WARNING: ... and {len(msgs) - MAX_WARNINGS} more problems")


def write_problems(save_dir, problems):
    """Write {split: [problem lines]} to the run folder's data_problems.txt and say so (the scans printed only the
    first MAX_WARNINGS); nothing when there are none. Returns the number of lines. File names are written as the
    bytes they are on disk, whatever their encoding, their control characters (a newline in a name) escaped: one
    line per problem."""
    lines = [f"{split}: {escape_controls(m)}" for split, msgs in problems.items() for m in msgs]
    if lines:
        path = Path(save_dir) / "data_problems.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", errors="surrogateescape")
        LOGGER.warning(f"WARNING: every skipped image and data note is listed in {path}")
    return len(lines)


class NoUsableImages(BadDataset):
    """A split in which not one image can be used; `problems` says why for each entry (for data_problems.txt)."""

    def __init__(self, message, problems):
        super().__init__(message)
        self.problems = list(problems)


@contextlib.contextmanager
def problems_listed_on_failure(save_dir, split, earlier=None, write=True):
    """Scan split `split` inside this block: when it has no usable image, every reason (and those of the splits
    scanned before it, `earlier` {split: problems}) is written to save_dir/data_problems.txt first (by the rank
    that `write`s), and the error names that file instead of pointing at the first few lines printed."""
    try:
        yield
    except NoUsableImages as e:
        n = len(e.problems) + sum(len(v) for v in (earlier or {}).values())
        if write:
            write_problems(save_dir, {**(earlier or {}), split: e.problems})
        where = f"; every reason is listed in {Path(save_dir) / 'data_problems.txt'}" if n else ""
        raise BadDataset(f"{e}{where}") from None
