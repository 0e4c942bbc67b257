"""What the readers of annotation files share (data/annotations.py: COCO JSON, Pascal VOC XML;
data/label_studio.py: Label Studio's JSON export): the AnnotationSource a split's labels come from, the checks
of one value, class names to ids, JSON read once, and the split a file or folder name says it is."""

import functools
import json
import threading
from pathlib import Path

import numpy as np

from data.image_files import scan_files
from data.label_formats import COORD_TOL, BadLine
from utils.errors import BadDataset

MAX_ANNOTATION_BYTES = 4 << 30  # a JSON file larger than this is refused before it is read (COCO's own: 450 MB)


class AnnotationSource:
    """A split's labels read from annotation files: what the scan hashes, where the cache goes, and each image's
    label lines."""

    kind = ""
    row = "annotation"  # what one converted line is called in a message

    def images(self, img_path):
        """(image files, [(entry, reason)] for every other entry met) of the split."""
        return scan_files(img_path)

    def prepare(self):
        """Read what every image needs, before the images are checked one by one: a fault here is the whole file's
        (one BadDataset), not each image's."""

    def label_files(self, im_files):
        """The file each image's labels come from (the label cache is rebuilt when one changes)."""
        raise NotImplementedError

    def absent(self, im_files):
        """[(entry, reason)] for each image the annotations label that is not among `im_files` (its objects are
        trained nowhere): asked when the split's labels are converted, and kept with them."""
        return []

    def own_files(self):
        """Files of this source that lie among the images (not images, and not worth a note)."""
        return set()

    def read(self, im_file, label_file, shape, names, fmt):
        """(label text in YOLO line form for `fmt`, notes, {count: n}) of one image of decoded `shape` (h, w);
        BadLine when the annotations of this image cannot be trusted. names: {id: name} of the dataset."""
        raise NotImplementedError


class JsonSource(AnnotationSource):
    """Labels of one JSON file for all the split's images: read once, by the first image's check (the scan's threads
    wait for it), its label cache beside it."""

    def __init__(self, json_file):
        self.lock = threading.Lock()
        self._index = None
        self.file = Path(json_file)
        self.cache_file = self.file.with_name(self.file.name.removesuffix(".json") + ".yolo-engine.cache")

    def label_files(self, im_files):
        return [str(self.file)] * len(im_files)

    def prepare(self):
        return self.index

    @property
    def index(self):
        """What `_build_index` makes of the file, built on first use."""
        with self.lock:
            if self._index is None:
                self._index = self._build_index()
        return self._index

    def _build_index(self):
        raise NotImplementedError


def number(x, what):
    """float(x), or BadLine naming `what` when it is not a finite number."""
    if isinstance(x, bool):  # JSON true is no coordinate
        raise BadLine(f"{what} {x!r} is not a number")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise BadLine(f"{what} {str(x)[:40]!r} is not a number") from None
    if not np.isfinite(v):
        raise BadLine(f"{what} is not finite")
    return v


def inside_image(box, where):
    """`box` (cx cy w h, normalised) of an annotation, or BadLine where a corner lies outside the image by more than
    COORD_TOL: the checks of label lines judge the values cx cy w h, which stay in [0, 1] for a box reaching far
    past an edge (a box of x 40..70 on a 64 px image), and would clip it instead of skipping the image."""
    cx, cy, w, h = box
    lo, hi = min(cx - w / 2, cy - h / 2), max(cx + w / 2, cy + h / 2)
    if lo < -COORD_TOL or hi > 1 + COORD_TOL:
        raise BadLine(f"{where}: box corners outside [0, 1] ({lo:.3g}..{hi:.3g} of the image)")
    return box


def line_text(values):
    """The values of one label line as text, with the precision the cache keeps."""
    return " ".join(f"{v:.9g}" for v in values)


def class_of(name, names, where):
    """The id of class `name` among the dataset's names {id: name}; BadLine naming `where` when it is none of them."""
    index = _by_name(tuple(names.items()))
    if name not in index:
        shown = ", ".join(list(names.values())[:20]) + (", ..." if len(names) > 20 else "")
        raise BadLine(f"{where}: class {name!r} is not a class of this dataset ({shown})")
    return index[name]


@functools.lru_cache(maxsize=8)
def _by_name(items):
    return {n: i for i, n in items}


def file_name(path):
    """The last part of a path written on any system: Label Studio on Windows writes `images\\x.jpg`."""
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


def read_json(path, kind):
    """The parsed JSON file `path`, parsed once per process and version of the file (finding a folder's names and
    converting read it both); one BadDataset line naming the file and `kind` when it cannot be read."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_ANNOTATION_BYTES:
            raise BadDataset(f"{path}: {path.stat().st_size >> 20} MB, more than any {kind} file this reads")
        return _load_json(str(path), path.stat().st_mtime_ns)
    except (OSError, ValueError, RecursionError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise BadDataset(f"{path}: not a readable {kind} file ({str(e)[:200]})") from None


@functools.lru_cache(maxsize=4)
def _load_json(path, mtime):
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def split_roles(named):
    """{'train': ..., 'val': ..., 'test': ...} from {split name: value} by the words COCO, VOC and Roboflow use."""
    out = {}
    for role, words in (("train", ("train",)), ("val", ("val", "valid")), ("test", ("test",))):
        hits = [v for k, v in sorted(named.items()) if any(w in k.lower() for w in words)]
        if hits:
            out[role] = hits[0]
    return out
