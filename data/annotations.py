"""Labels that are not YOLO text files, read natively: COCO JSON, Pascal VOC XML (and Label Studio JSON, in
data/label_studio.py), and finding a dataset in a folder.

The label rule of a split (`label_source`, asked by YOLODataset for every split): YOLO text files (the last
/images/ of an image path becomes /labels/) wherever that labels folder exists; else
- a split that is a list file `<root>/ImageSets/Main/<name>.txt` beside `<root>/Annotations/` and `<root>/JPEGImages/`
  is Pascal VOC: its lines are image ids (the first word of each), the image `JPEGImages/<id>.jpg` (or another image
  suffix), the labels `Annotations/<id>.xml`;
- a split that is a folder of images `<name>` with `annotations/<prefix>_<name>.json` in its parent or grandparent
  (COCO's `annotations/instances_val2017.json` beside `val2017/` or `images/val2017/`; the prefix is the label
  format's `coco_prefixes`: `instances` for boxes and outlines, `person_keypoints` for keypoints), or with Roboflow's
  `_annotations.coco.json` inside it, is COCO: each image's annotations are found by its file name (of several images
  of one name in sub-folders, by the `file_name` that ends its path in the most folders; none or a tie skips it);
- a split that is a .json file holding a list is a Label Studio JSON export (data/label_studio.py).

Either is converted, image by image, into the label lines the task's format reads (its `line`), which then pass
the checks of YOLO label lines (data/labels.verify_image_label), so the bad-input policy is one: coordinates
outside the image by more than 1 % skip the image, less is clipped and counted, a zero-size box skips it, and so
does an object whose class name is not one of the dataset's (COCO `category_id` -> its category's name; VOC
`<name>`), since training it as background would teach the model to miss it. What the formats themselves say to
leave out is left out, counted and named: COCO `iscrowd` 1 annotations (its evaluation ignores crowd regions, and the
peers' converters drop them) and VOC `difficult` 1 objects (its evaluation ignores them; the peers' VOC conversion
drops them). An image whose listed size is not its decoded size is skipped (its boxes would land elsewhere); a size
listed as 0 x 0, or not at all, is unknown, and the decoded one is used (LabelImg writes 0 x 0 for an image whose
suffix is not its format; boxes are in pixels, so they do not depend on it).
VOC boxes are 1-based pixel corners; they become boxes as the peers convert them (centre - 1, width xmax - xmin).
The result goes into the label cache of the split like YOLO labels (beside the annotation file; for VOC, beside the
ImageSets list), so the files are read once.

`find_layout(folder)`: a --data that is a folder holding a dataset: its data.yaml (a Roboflow export), a COCO layout
(`annotations/instances_<split>.json`, or Roboflow's `<split>/_annotations.coco.json`), a VOC one (`Annotations/`,
`ImageSets/Main/`, `JPEGImages/`; the lists train or trainval, val or test, else those whose names say train and val,
as CVAT's subsets `Train`, `Validation`) or Label Studio JSON exports (`label_studio.layout`), sought in that order.
The class names are COCO's categories in id order (of the val split's file, the smaller one; COCO's files share
them) or, for VOC, those its labelmap.txt lists but `background` (CVAT and Datumaro write one: the project's labels, in
its order), else the object names of the training split's files in sorted order (for the 20 VOC classes, VOC's own
order). A VOC id may name a sub-folder (`batch1/0001`: JPEGImages/batch1/0001.jpg, Annotations/batch1/0001.xml), as
CVAT writes the images of an archive that had folders.

XML is parsed by the standard library's expat, which neither fetches external entities nor expands entities
without bound; a file that declares a DOCTYPE or entities (no VOC file does), in whatever encoding, is refused before
a tree is built, and an annotation file is read as label files are (a regular file of at most MAX_LABEL_BYTES).
"""

import xml.etree.ElementTree as ET
from pathlib import Path
from xml.parsers import expat

import numpy as np

from data import label_studio
from data.annotation_source import (
    AnnotationSource,
    JsonSource,
    class_of,
    file_name,
    inside_image,
    line_text,
    number,
    read_json,
    split_roles,
)
from data.image_files import IMG_FORMATS, MISSING, entry_problem, img2label_paths
from data.label_formats import BadLine
from data.labels import read_label_bytes
from utils.errors import BadDataset
from utils.log import LOGGER

ROBOFLOW_COCO = "_annotations.coco.json"


def merge_parts(parts):
    """One outline from the parts of a COCO polygon (an object cut in two by an occluder): each next part is joined
    at the pair of vertices nearest to the outline so far, by a seam walked there and back, so the filled outline is
    the union of the parts (Ultralytics joins parts the same way)."""
    out = parts[0]
    for p in parts[1:]:
        d = ((out[:, None, :] - p[None, :, :]) ** 2).sum(-1)
        i, j = np.unravel_index(np.argmin(d), d.shape)
        out = np.concatenate([out[: i + 1], np.roll(p, -j, 0), p[j : j + 1], out[i:]])
    return out


class CocoSource(JsonSource):
    """Annotations of a COCO JSON file (`images`, `annotations`, `categories`), images matched by file name; its
    index: {file name: (image entry, [its annotations])} and {category id: name}."""

    kind = "COCO JSON"

    def __init__(self, json_file, among_images=False):
        super().__init__(json_file)
        self.among_images = among_images  # Roboflow's file lies in the images folder

    def own_files(self):
        return {str(self.file), str(self.cache_file)} if self.among_images else set()

    def _build_index(self):
        d = load_coco(self.file)
        cats = category_names(d, self.file)
        by_id = {img["id"]: (img, []) for img in d["images"]}
        for a in d["annotations"]:
            if not isinstance(a, dict) or a.get("image_id") not in by_id:
                continue  # an annotation of no listed image labels nothing here
            by_id[a["image_id"]][1].append(a)
        images = {}
        for img, anns in by_id.values():
            images.setdefault(file_name(img.get("file_name", "")), []).append((img, anns))
        return images, cats

    def absent(self, im_files):
        held = {file_name(f) for f in im_files}
        return [(f"{self.file}: image {str(img.get('file_name'))[:200]}", f"listed with {len(anns)} annotations, but "
                 f"the split holds no image of that name") for name, entries in self.index[0].items()
                if name not in held for img, anns in entries if anns]

    def entry(self, im_file):
        """(image entry, its annotations) that names `im_file`, None where none does. Of several entries of its file
        name (CVAT keeps an uploaded archive's folders: a/0001.jpg, b/0001.jpg), the one whose `file_name` ends the
        image's path in the most folders; BadLine where that is not one."""
        entries = self.index[0].get(file_name(im_file))
        if not entries or len(entries) == 1:
            return entries[0] if entries else None
        path = "/" + Path(im_file).as_posix().lstrip("/")
        depth = {}
        for e in entries:
            listed = "/" + str(e[0].get("file_name", "")).replace("\\", "/").removeprefix("./").lstrip("/")
            if path.endswith(listed):
                depth.setdefault(listed.count("/"), []).append(e)
        best = depth[max(depth)] if depth else []
        if len(best) != 1:
            shown = ", ".join(str(e[0].get("file_name"))[:60] for e in entries[:3])
            raise BadLine(f"{self.file}: {len(entries)} images are named {file_name(im_file)} ({shown}); which one "
                          "this is cannot be told from their file_name")
        return best[0]

    def read(self, im_file, label_file, shape, names, fmt):
        cats = self.index[1]
        entry = self.entry(im_file)
        if entry is None:
            return None, [], {}  # not listed: a background, as an image without a label file
        img, anns = entry
        h, w = shape
        listed = (img.get("width"), img.get("height"))
        if all(listed) and listed != (w, h):  # a size listed as none or 0 is unknown
            raise BadLine(f"{self.file}: image {img.get('file_name')} is {img.get('width')}x{img.get('height')} "
                          f"there and {w}x{h} decoded; its boxes would be misplaced")
        lines, crowd, masks = [], 0, 0
        for a in anns:
            if a.get("iscrowd"):
                crowd += 1
                continue
            where = f"{self.file} annotation {a.get('id')}"
            if a.get("category_id") not in cats:
                raise BadLine(f"{where}: category_id {a.get('category_id')!r} is not one of its categories")
            c = class_of(cats[a["category_id"]], names, where)
            box, polygon, kpts = _coco_geometry(a, w, h, where)
            masks += polygon is None and bool(a.get("segmentation"))
            lines.append(f"{c} {line_text(fmt.line(box, polygon, kpts))}")
        notes = [f"{crowd} crowd annotations left out (iscrowd 1: COCO's evaluation ignores crowd regions)"] * bool(
            crowd) + [f"{masks} annotations with RLE masks kept as boxes (outlines are read from polygons)"] * bool(
            masks)
        return "\n".join(lines), notes, {"left_out": crowd}


def _coco_geometry(a, w, h, where):
    """(box xywhn, outline (k, 2) normalised or None, keypoints (K, 3) normalised or None) of one annotation."""
    bbox = a.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4:
        raise BadLine(f"{where}: bbox must be [x, y, width, height], got {str(bbox)[:60]}")
    x, y, bw, bh = (number(v, "bbox value") for v in bbox)
    box = inside_image([(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h], where)
    seg = a.get("segmentation")
    polygon = None
    if isinstance(seg, list) and seg:
        parts = []
        for part in seg:
            if not isinstance(part, list) or len(part) < 6 or len(part) % 2:
                raise BadLine(f"{where}: a polygon must list >= 3 x y pairs")
            parts.append(np.array([number(v, "polygon value") for v in part]).reshape(-1, 2) / (w, h))
        polygon = merge_parts(parts)
    kpts = a.get("keypoints")
    if kpts is not None:
        if not isinstance(kpts, list) or len(kpts) % 3:
            raise BadLine(f"{where}: keypoints must be x y visibility triples")
        kpts = np.array([number(v, "keypoint value") for v in kpts]).reshape(-1, 3) / (w, h, 1)
    return box, polygon, kpts


def load_coco(path):
    """A COCO JSON file's dict, checked for the lists this module reads; one BadDataset line naming the file
    otherwise."""
    d = read_json(path, "COCO JSON")
    bad = [k for k in ("images", "annotations", "categories") if not isinstance(d.get(k) if isinstance(d, dict)
                                                                                   else None, list)]
    if bad:
        raise BadDataset(f"{path}: a COCO file needs the lists {', '.join(bad)}")
    if not all(isinstance(x, dict) and "id" in x for x in d["images"] + d["categories"]):
        raise BadDataset(f"{path}: every image and category needs an 'id'")
    return d


def category_names(d, path):
    """{category id: name} of a COCO dict. A category that no annotation uses and that is only the supercategory
    of the others is left out: Roboflow's COCO exports add one (id 0, the project's name) above the real classes."""
    used = {a.get("category_id") for a in d["annotations"] if isinstance(a, dict)}
    # supercategories of other categories: COCO's own `person` is its own supercategory, and a class still
    supers = {str(c.get("supercategory")) for c in d["categories"] if c.get("supercategory") != c.get("name")}
    cats = {}
    for c in d["categories"]:
        name = str(c.get("name", "")).strip()
        if not name:
            raise BadDataset(f"{path}: category {c['id']} has no name")
        if c["id"] not in used and name in supers and len(d["categories"]) > 1:
            continue
        cats[c["id"]] = name
    if len(set(cats.values())) != len(cats):
        raise BadDataset(f"{path}: two categories share a name; classes are matched by name")
    return cats


class VocSource(AnnotationSource):
    """A Pascal VOC split: `ImageSets/Main/<name>.txt` ids, `JPEGImages/<id>.*`, `Annotations/<id>.xml`."""

    kind = "Pascal VOC XML"
    row = "object"

    def __init__(self, list_file):
        self.list_file = Path(list_file)
        self.root = self.list_file.parents[2]
        self.cache_file = self.list_file.with_name(self.list_file.stem + ".yolo-engine.cache")

    def images(self, img_path):
        """(image paths in list order, [(entry, reason)] for ids without an image)."""
        files, others = [], []
        folder = self.root / "JPEGImages"
        # an id may name a sub-folder (CVAT keeps an uploaded archive's folders: `batch1/0001`)
        suffixes = {p.relative_to(folder).with_suffix("").as_posix(): p for p in folder.rglob("*")} \
            if folder.is_dir() else {}
        for line in self.list_file.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            if not line.split():
                continue
            image_id = line.split()[0]
            p = suffixes.get(image_id)
            if p is not None and p.suffix[1:].lower() in IMG_FORMATS:
                files.append(str(p))
            else:
                others.append((f"{self.list_file}: {image_id}", f"no image {image_id}.* in {folder}"))
        return files, others

    def label_files(self, im_files):
        images = self.root / "JPEGImages"
        return [str((self.root / "Annotations" / Path(f).relative_to(images)).with_suffix(".xml")) for f in im_files]

    def read(self, im_file, label_file, shape, names, fmt):
        if entry_problem(label_file) == MISSING:
            return None, [], {}  # an image without annotations: a background (a FIFO or folder there: named)
        objects, size = read_voc_xml(label_file)
        h, w = shape
        if size is not None and all(size) and size != (w, h):
            raise BadLine(f"{label_file}: <size> {size[0]}x{size[1]} but the image is {w}x{h} decoded")
        lines, difficult = [], 0
        for i, (name, hard, (x1, y1, x2, y2)) in enumerate(objects, 1):
            if hard:
                difficult += 1
                continue
            c = class_of(name, names, f"{label_file} object {i}")
            inside_image([(x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h],
                         f"{label_file} object {i}")  # the corners as written: 0 (CVAT's) or 1 is the first pixel
            box = [((x1 + x2) / 2 - 1) / w, ((y1 + y2) / 2 - 1) / h, (x2 - x1) / w, (y2 - y1) / h]
            lines.append(f"{c} {line_text(fmt.line(box, None, None))}")
        notes = [f"{difficult} difficult objects left out (VOC's evaluation ignores them)"] * bool(difficult)
        return "\n".join(lines), notes, {"left_out": difficult}


def read_voc_xml(path):
    """([(name, difficult?, (xmin, ymin, xmax, ymax))], (width, height) or None) of a VOC annotation file; BadLine
    naming the file when it is not one (also: not a regular file, over the label budget, see read_label_bytes)."""
    data = read_label_bytes(path)
    if data is None:
        raise BadLine(f"{path}: no such file")
    _refuse_declarations(data, path)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        raise BadLine(f"{path}: not well-formed XML ({e})") from None
    size = root.find("size")
    wh = None
    if size is not None and size.findtext("width") and size.findtext("height"):
        wh = tuple(int(number(size.findtext(k), f"{path} <size> {k}")) for k in ("width", "height"))
    objects = []
    for i, obj in enumerate(root.iter("object"), 1):
        name, box = (obj.findtext("name") or "").strip(), obj.find("bndbox")
        if not name or box is None:
            raise BadLine(f"{path} object {i}: needs <name> and <bndbox>")
        corners = tuple(number(box.findtext(k), f"{path} object {i} {k}") for k in ("xmin", "ymin", "xmax", "ymax"))
        objects.append((name, (obj.findtext("difficult") or "0").strip() == "1", corners))
    return objects, wh


def _refuse_declarations(data, path):
    """Refuse XML that declares a DOCTYPE or entities (a billion-laughs file; no VOC annotation declares any) before
    anything is built. expat itself finds them, in whatever encoding the file says it is in (a search of the bytes
    for '<!DOCTYPE' misses a UTF-16 file)."""
    def refuse(*_):
        raise BadLine(f"{path}: declares a DOCTYPE or entities, which no VOC annotation does (not read)")
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = parser.EntityDeclHandler = refuse
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        raise BadLine(f"{path}: not well-formed XML ({e})") from None


def label_source(img_path, fmt):
    """The AnnotationSource of a split entry (module docstring), or None for YOLO text labels."""
    if isinstance(img_path, (list, tuple)) or any(c in str(img_path) for c in "*?["):
        return None
    p = Path(img_path)
    if label_studio.is_export(p):
        if fmt.name == "pose":
            raise BadDataset(f"{p}: pose reads no {label_studio.KIND} export (data/label_studio.py)")
        return label_studio.LabelStudioSource(p)
    if p.is_file() and p.suffix == ".txt" and p.parent.name == "Main" and p.parent.parent.name == "ImageSets":
        root = p.parents[2]
        if (root / "Annotations").is_dir() and (root / "JPEGImages").is_dir():
            return VocSource(p)
        return None
    labels = Path(img2label_paths([str(p / "x.jpg")])[0]).parent  # the images' own folder without an /images/
    if not p.is_dir() or (labels != p and labels.is_dir()):
        return None  # YOLO labels exist: they win over any annotation file
    if (p / ROBOFLOW_COCO).is_file():
        return CocoSource(p / ROBOFLOW_COCO, among_images=True)
    for prefix in fmt.coco_prefixes:
        for folder in (p.parent / "annotations", p.parent.parent / "annotations"):
            if (folder / f"{prefix}_{p.name}.json").is_file():
                return CocoSource(folder / f"{prefix}_{p.name}.json")
    return None


def find_layout(folder, keypoints=False):
    """(dataset dict or None, dataset YAML or None) of a folder given as --data: its data.yaml (a Roboflow export:
    read as any dataset YAML), else the dict of the COCO, VOC or Label Studio layout found in it (module docstring);
    keypoints: the COCO files sought hold keypoints (a pose run). BadDataset saying what was looked for when none is
    found."""
    folder = Path(folder).resolve()
    yamls = [y for y in (folder / "data.yaml", folder / "data.yml") if y.is_file()] or sorted(folder.glob("*.yaml"))
    if len(yamls) == 1:
        return None, yamls[0]
    d, kind = _coco_layout(folder, keypoints), "COCO JSON"
    if d is None:
        d, kind = _voc_layout(folder), "Pascal VOC XML"
    if d is None:
        d, kind = label_studio.layout(folder, keypoints), label_studio.KIND
    if d is not None:
        LOGGER.info(f"{folder}: a {kind} dataset, {len(d['names'])} classes; train {d['train']}, val {d['val']}")
    else:
        prefix = "person_keypoints" if keypoints else "instances"
        raise BadDataset(f"{folder} is a folder holding no dataset this project reads: looked for one data.yaml "
                         f"({len(yamls)} YAML files found), COCO's annotations/{prefix}_<split>.json, Roboflow's "
                         f"<split>/{ROBOFLOW_COCO}, VOC's Annotations/, ImageSets/Main/ and JPEGImages/, and "
                         f"{label_studio.KIND} exports (a train and a val .json){_split_files(folder, prefix)}")
    return d, None


def _split_files(folder, prefix):
    """What the error of a folder holding no dataset adds where a child folder holds a data.yaml, or it holds a
    layout's split files but no training and validation pair among them (CVAT exports a task without subsets as one
    split, `default`)."""
    nested = sorted([*folder.glob("*/data.yaml"), *folder.glob("*/data.yml")])
    if nested:  # an archive unpacked into a folder of its own
        return f"; it holds {nested[0].relative_to(folder).as_posix()}: give that file, or its folder, as --data"
    main = folder / "ImageSets" / "Main"
    found = [*sorted((folder / "annotations").glob(f"{prefix}_*.json")), *sorted(folder.glob(f"*/{ROBOFLOW_COCO}")),
             *(sorted(f for f in main.glob("*.txt") if "_" not in f.stem) if (folder / "Annotations").is_dir() else [])]
    if not found:
        return ""
    shown = ", ".join(f.relative_to(folder).as_posix() for f in found[:6])
    return (f"; it holds {shown}, but not a training and a validation split, whose names must say train and val "
            "(or valid, test): name the splits so (CVAT: the task's subsets), or write a dataset YAML naming them")


def _coco_layout(folder, keypoints):
    prefix = "person_keypoints" if keypoints else "instances"
    files = {f.stem.removeprefix(f"{prefix}_"): f for f in sorted((folder / "annotations").glob(f"{prefix}_*.json"))}
    images = {}
    for split in files:
        for images_dir in (folder / split, folder / "images" / split):
            if images_dir.is_dir():
                images[split] = images_dir
                break
    if not images:  # Roboflow's COCO export: the file inside each split's folder
        images = {p.parent.name: p.parent for p in folder.glob(f"*/{ROBOFLOW_COCO}")}
        files = {k: v / ROBOFLOW_COCO for k, v in images.items()}
    splits = split_roles(images)
    if "train" not in splits or "val" not in splits:
        return None
    split_of = {v: k for k, v in images.items()}
    coco = load_coco(files[split_of[splits["val"]]])
    cats = category_names(coco, files[split_of[splits["val"]]])
    d = {"path": str(folder), **{k: str(v) for k, v in splits.items()},
         "names": {i: cats[c] for i, c in enumerate(sorted(cats))}}
    if keypoints:
        d.update(_coco_keypoints(coco, files[split_of[splits["val"]]]))
    return d


def _coco_keypoints(coco, path):
    """kpt_shape, flip_idx (from keypoint names: each `left_x` trades places with `right_x`) and skeleton (COCO's
    pairs are 1-based) of a COCO keypoint file's first category with keypoints."""
    cat = next((c for c in coco["categories"] if c.get("keypoints")), None)
    if cat is None:
        raise BadDataset(f"{path}: no category lists 'keypoints'")
    kpts = [str(k) for k in cat["keypoints"]]
    swap = {"left": "right", "right": "left"}
    flip = []
    for k in kpts:
        side, _, rest = k.partition("_")
        twin = f"{swap[side]}_{rest}" if side in swap else k
        flip.append(kpts.index(twin) if twin in kpts else kpts.index(k))
    skeleton = [[a - 1, b - 1] for a, b in cat.get("skeleton") or [] if 1 <= a <= len(kpts) and 1 <= b <= len(kpts)]
    return {"kpt_shape": [len(kpts), 3], "flip_idx": flip, "skeleton": skeleton or None}


def _voc_layout(folder):
    main = folder / "ImageSets" / "Main"
    if not ((folder / "Annotations").is_dir() and (folder / "JPEGImages").is_dir() and main.is_dir()):
        return None
    found = {f.stem: f for f in main.glob("*.txt")}
    # `<class>_<split>.txt` are per-class lists of a split; trainval is no validation split
    lists = {k: f for k, f in found.items() if not any(k.endswith(f"_{other}") for other in found)}
    roles = split_roles({k: f for k, f in lists.items() if k.lower() != "trainval"})
    train = lists.get("train") or lists.get("trainval") or roles.get("train")
    val = lists.get("val") or lists.get("test") or roles.get("val") or roles.get("test")
    if train is None or val is None:
        return None
    names = _labelmap(folder / "labelmap.txt")
    if not names:
        found = set()
        for f in VocSource(train).label_files(VocSource(train).images(None)[0]):
            try:
                found.update(name for name, _, _ in read_voc_xml(f)[0])
            except (BadLine, OSError):
                continue  # the scan names it
        names = sorted(found)
    d = {"path": str(folder), "train": str(train), "val": str(val), "names": dict(enumerate(names))}
    test = lists.get("test") or roles.get("test")
    if test is not None and val != test:
        d["test"] = str(test)
    return d


def _labelmap(path):
    """The object classes a VOC export's labelmap.txt lists (CVAT and Datumaro write it: `name:color:parts:actions`
    lines, the first `background`, which is no object), in its order; [] without one."""
    if not path.is_file():
        return []
    try:
        text = read_label_bytes(path).decode("utf-8-sig", errors="replace")
    except BadLine as e:
        raise BadDataset(str(e)) from None
    names = [line.split(":", 1)[0].strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
    return list(dict.fromkeys(n for n in names if n and n != "background"))
