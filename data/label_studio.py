"""Label Studio's JSON export (Export > JSON: a list of tasks) read natively, for detection and segmentation.

A split is one export file. Each task names its image in `data` (the value of `image`, else the first value that
names a file with an image suffix): an upload `/data/upload/<project>/<8 hex digits>-<name>`, a local-storage path
`/data/local-files/?d=<path>`, a cloud or web URL. The image is found by file name among the image files under the
export's folder (sub-folders included): that name, else the name without the 8 hex digits and hyphen Label Studio
puts before an uploaded file's name, so the original files serve as well as the copies in Label Studio's upload
folder; of several files of that name, the one whose path ends as the task's does in the most folders. A task whose
name finds no image, or several, is left out, named (`ignored`); so is an image that several annotated tasks name
(which task is right cannot be told).

Of a task's annotations the latest one that is not cancelled (`was_cancelled`: the annotator skipped the task) is
read, by `updated_at`, then `created_at`, then id; the image's note says how many others were not read. Predictions
are a model's, never read. A task without an annotation, or with cancelled ones only, is not labelled yet: left out
and named, not taken as a background; a submitted annotation without regions is a background.

Regions, with one label each: `rectanglelabels` (value x, y, width, height in percent of the image, x y the top-left
corner) and `polygonlabels` (value points [[x, y], ...] in percent; its box is the points' envelope, and a detector
reads that box). They become label lines and pass the checks of YOLO lines, as COCO's do (data/annotations.py):
outside the image by more than 1 % skips the image, less is clipped and counted, a label the dataset does not name
skips it. Label Studio's own cases, each skipping the image (named), so that no object on a kept image is trained as
background:
- a rectangle rotated in the editor (value.rotation not a multiple of 360): an upright box is not its region;
- a region with no label or with several; a region of a kind not read as an object (ellipse, brush mask, a
  rectangle or polygon drawn without a label tag);
- a region drawn on the image turned in the editor (`image_rotation`), or whose `original_width` x
  `original_height` has another aspect ratio than the image found (another image of that name; percent coordinates
  fit any resized copy).
Key points (`keypointlabels`) are points, not objects: left out, noted. Pose reads no Label Studio export: each key
point is its own region, and the export does not say which object it belongs to.

`layout(folder)`: the exports in a --data folder or its child folders (a JSON file that holds a list); the split of
each is the word its path holds (`train.json`, `val.json`; or `train/`, `valid/` folders each holding one export,
as Roboflow's COCO layout). One export without such a word is refused: training and validating on one set of images
would report a mAP that means nothing. The class names are those of the training export's regions, sorted (the
project's label config, which orders them, is not in the export).
"""

import re
import urllib.parse
from pathlib import Path

import numpy as np

from data.annotation_source import (
    JsonSource,
    class_of,
    file_name,
    inside_image,
    line_text,
    number,
    read_json,
    split_roles,
)
from data.image_files import IMG_FORMATS, scan_files, suffix
from data.label_formats import BadLine
from utils.errors import BadDataset

KIND = "Label Studio JSON"
UPLOAD_PREFIX = re.compile(r"[0-9a-f]{8}-(.+)")  # what Label Studio puts before an uploaded file's name
REGIONS = ("rectanglelabels", "polygonlabels")  # read as objects; the value's key of the labels is the type
POINTS = ("keypointlabels", "keypoint")
OBJECTS = ("rectangle", "polygon", "ellipse", "brush")  # regions without a label tag; any other `*labels` too


def is_export(path):
    """Whether `path` is a .json file holding a list (a Label Studio JSON export; a COCO file holds a mapping)."""
    p = Path(path)
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(256).lstrip()[:1] == b"["


def load_export(path):
    """The tasks of an export, checked for what this module reads; one BadDataset line naming the file otherwise."""
    tasks = read_json(path, KIND)
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise BadDataset(f"{path}: a {KIND} export is a list of tasks (objects)")
    if tasks and not any(isinstance(t.get("data"), dict) for t in tasks):
        raise BadDataset(f"{path}: its tasks have no 'data': export the project as JSON (JSON-MIN and CSV are not "
                         "read)")
    return tasks


def task_image(task):
    """The path of a task's image as its data writes it ('/'-separated; module docstring), or None."""
    data = task.get("data")
    if not isinstance(data, dict):
        return None
    for v in [data.get("image"), *data.values()]:
        if isinstance(v, str) and v.strip():
            url = urllib.parse.urlsplit(v.strip())
            local = urllib.parse.parse_qs(url.query).get("d")  # /data/local-files/?d=<path>
            path = (local[0] if local else urllib.parse.unquote(url.path)).replace("\\", "/")
            if suffix(file_name(path)) in IMG_FORMATS:
                return path
    return None


def find_image(ref, by_name):
    """The image files (under the export's folder, {file name: [paths]}) that a task's image path `ref` names: those
    of its file name, else of that name without the upload prefix; of several, the one whose path ends as `ref` does
    in the most folders (a local-storage path such as a/0001.jpg beside b/0001.jpg)."""
    name = file_name(ref)
    bare = UPLOAD_PREFIX.fullmatch(name)
    paths = by_name.get(name) or (by_name.get(bare.group(1), []) if bare else [])
    parts = [p for p in ref.split("/") if p]
    for k in range(len(parts), 1, -1):
        if len(paths) < 2:
            break
        tail = "/" + "/".join(parts[-k:])
        hits = [p for p in paths if Path(p).as_posix().endswith(tail)]
        paths = hits if len(hits) == 1 else paths
    return paths


def latest_annotation(task):
    """(the latest annotation not cancelled or None, how many others the task has)."""
    anns = task.get("annotations", task.get("completions"))  # `completions`: exports of Label Studio before 1.0
    anns = [a for a in anns if isinstance(a, dict)] if isinstance(anns, list) else []
    kept = [a for a in anns if not a.get("was_cancelled")]
    if not kept:
        return None, len(anns)
    return max(kept, key=lambda a: (str(a.get("updated_at") or a.get("created_at") or ""),
                                    str(a.get("created_at") or ""), a["id"] if isinstance(a.get("id"), int) else -1)
               ), len(anns) - 1


def region_label(value, kind, where):
    """The one label of a region."""
    labels = value.get(kind)
    if not isinstance(labels, list) or len(labels) != 1 or not isinstance(labels[0], str):
        n = len(labels) if isinstance(labels, list) else 0
        raise BadLine(f"{where}: a region needs one label, this has {n} ({str(labels)[:60]})")
    return labels[0]


def region_geometry(value, kind, where):
    """(box xywhn, outline (k, 2) normalised or None) of a rectanglelabels or polygonlabels value."""
    if kind == "rectanglelabels":
        x, y, w, h = (number(value.get(k), f"{where}: {k}") / 100 for k in ("x", "y", "width", "height"))
        rotation = number(value.get("rotation") or 0, f"{where}: rotation")
        if rotation % 360:
            raise BadLine(f"{where}: a box rotated {rotation:g} degrees; an upright box is not its region")
        return [x + w / 2, y + h / 2, w, h], None
    points = value.get("points")
    if not isinstance(points, list) or len(points) < 3 or not all(isinstance(p, list) and len(p) == 2 for p in points):
        raise BadLine(f"{where}: a polygon's points must be >= 3 [x, y] pairs")
    xy = np.array([[number(v, f"{where}: point") for v in p] for p in points]) / 100
    (x1, y1), (x2, y2) = xy.min(0), xy.max(0)
    return [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], xy


def check_frame(result, w, h, where):
    """A region drawn on a turned image, or on an image of another aspect ratio, would land elsewhere on this one."""
    turned = number(result.get("image_rotation") or 0, f"{where}: image_rotation")
    if turned % 360:
        raise BadLine(f"{where}: drawn on the image turned {turned:g} degrees in the editor")
    ow, oh = result.get("original_width"), result.get("original_height")
    if ow and oh:
        ow, oh = number(ow, f"{where}: original_width"), number(oh, f"{where}: original_height")
        if oh <= 0 or abs(ow / oh - w / h) > 0.01 * w / h:
            raise BadLine(f"{where}: drawn on a {ow:g}x{oh:g} image, this one is {w}x{h} (another aspect ratio); "
                          "its regions would be misplaced")


class LabelStudioSource(JsonSource):
    """The tasks of one export; its index: ({image path: (task id, annotation, how many others)}, [(entry, why)] for
    the tasks left out)."""

    kind = KIND
    row = "region"  # a converted line: the n-th region read of the annotation

    def images(self, img_path):
        images, left = self.index
        return list(images), left

    def _build_index(self):
        tasks = load_export(self.file)
        by_name = {}
        for f in scan_files(str(self.file.parent))[0]:
            by_name.setdefault(Path(f).name, []).append(f)
        claims, left = {}, []
        for i, task in enumerate(tasks):
            tid = str(task.get("id", f"#{i + 1}"))[:40]
            entry = f"{self.file}: task {tid}"
            ref = task_image(task)
            if ref is None:
                left.append((entry, "its data names no image file"))
                continue
            name = file_name(ref)
            paths = find_image(ref, by_name)
            if len(paths) != 1:
                bare = UPLOAD_PREFIX.fullmatch(name)
                tried = name + (f" or {bare.group(1)}" if bare else "")
                left.append((entry, f"no image named {tried} under {self.file.parent}" if not paths else
                             f"{len(paths)} images named {Path(paths[0]).name} ({', '.join(paths[:3])})"))
                continue
            ann, others = latest_annotation(task)
            if ann is None:
                left.append((f"{entry} ({name})", f"its {others} annotations are all cancelled (the task was skipped)"
                             if others else "not annotated"))
                continue
            claims.setdefault(paths[0], []).append((tid, ann, others))
        images = {}
        for path, claim in claims.items():
            if len(claim) > 1:
                ids = ", ".join(str(c[0]) for c in claim)
                left.append((path, f"named by {len(claim)} annotated tasks of {self.file} ({ids})"))
            else:
                images[path] = claim[0]
        return images, left

    def read(self, im_file, label_file, shape, names, fmt):
        tid, ann, others = self.index[0][im_file]
        entry = f"{self.file}: task {tid}"
        h, w = shape
        lines, points = [], 0
        results = ann.get("result") or []
        if not isinstance(results, list):
            raise BadLine(f"{entry}: its annotation's result is not a list")
        for k, r in enumerate(results, 1):
            where = f"{entry} result {k}"
            if not isinstance(r, dict):
                raise BadLine(f"{where}: not an object")
            kind = str(r.get("type", ""))
            if kind in POINTS:
                points += 1
                continue
            if kind not in REGIONS:
                if kind.endswith("labels") or kind in OBJECTS:
                    raise BadLine(f"{where}: a {kind} region is not read as an object (rectanglelabels and "
                                  "polygonlabels are), and its object would be trained as background")
                continue  # choices, text, ratings: no region
            value = r.get("value") if isinstance(r.get("value"), dict) else {}
            check_frame(r, w, h, where)
            c = class_of(region_label(value, kind, where), names, where)
            box, outline = region_geometry(value, kind, where)
            inside_image(box, where)
            lines.append(f"{c} {line_text(fmt.line(box, outline, None))}")
        notes = [f"{others} other annotations of task {tid} not read (the latest one not cancelled is)"] * bool(
            others) + [f"{points} key points not read (points, not objects)"] * bool(points)
        return "\n".join(lines), notes, {}


def class_names(path):
    """The sorted labels of the regions of an export's latest annotations."""
    names = set()
    for task in load_export(path):
        ann, _ = latest_annotation(task)
        results = (ann or {}).get("result")
        for r in results if isinstance(results, list) else []:
            value = r.get("value") if isinstance(r, dict) and isinstance(r.get("value"), dict) else {}
            labels = value.get(r.get("type")) if r.get("type") in REGIONS else None
            if isinstance(labels, list) and len(labels) == 1 and isinstance(labels[0], str):
                names.add(labels[0])
    return sorted(names)


def layout(folder, keypoints=False):
    """The dataset dict of the Label Studio exports in `folder` (module docstring), or None when it holds none."""
    found = sorted(folder.glob("*.json")) + sorted(folder.glob("*/*.json"))
    exports = {f.relative_to(folder).as_posix(): f for f in found if is_export(f)}
    if not exports:
        return None
    shown = ", ".join(list(exports)[:5])
    if keypoints:
        raise BadDataset(f"{folder}: {KIND} exports ({shown}) are not read for pose: each key point is a region of "
                         "its own, and the export does not say which object it belongs to")
    splits = split_roles(exports)
    if "train" not in splits or "val" not in splits or splits["train"] == splits["val"]:
        raise BadDataset(f"{folder}: {KIND} exports {shown}, but not one for training and another for validation: "
                         "name them after their split (train.json, val.json) or put each in a train/ or val/ folder")
    names = class_names(splits["train"])
    if not names:
        raise BadDataset(f"{splits['train']}: no labelled rectangle or polygon in its tasks' latest annotations")
    return {"path": str(folder), **{k: str(v) for k, v in splits.items()}, "names": dict(enumerate(names))}
