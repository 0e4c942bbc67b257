"""YOLO-format detection / instance-segmentation / pose dataset: verified labels (cached), image caching, mosaic,
copy-paste, random perspective, mixup, HSV, flips, letterbox/rect shapes, polygon masks, keypoints, and the batch
collate of docs/design.md."""

import math
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from data.annotations import label_source
from data.augment import (
    HYP_DEFAULTS,
    Canvas,
    Instances,
    SampleRNG,
    apply_hsv,
    chw_rgb,
    copy_paste,
    hsv_gains,
    hsv_tables,
    letterbox,
    mixup,
    random_perspective,
)
from data.image_cache import DiskCopies, fill_disk, fill_memory, resized_shape
from data.image_files import IMG_FORMATS, img2label_paths, read_disk_cache, scan_files, suffix
from data.label_cache import cache_path
from data.label_formats import get_format
from data.label_store import LabelStore
from data.labels import NoUsableImages, cache_labels, read_image
from data.loader import rank_indices
from data.targets import Targets
from utils.errors import BadDataset, BadFile
from utils.heap import release_heap
from utils.log import LOGGER
from utils.ops import xyn2xy, xywhn2xyxy

MAX_SUBSTITUTES = 16  # images tried in place of one that vanished during training before giving up


class ImageGone(FileNotFoundError):
    """An image that was readable when the labels were scanned can no longer be read."""

    def __init__(self, path, index):
        super().__init__(path)
        self.index = index


class UnknownClasses(BadDataset):
    """Labels with class ids the dataset YAML does not name (YOLODataset's `names_from`)."""


def _listed_files(img_path, source, prefix):
    """(image files, their label files, '<entry>: ignored, <why>' for every other entry) of a split, read from its
    annotation `source` (None: YOLO text files); NoUsableImages where it holds no image."""
    try:
        im_files, others = source.images(img_path) if source is not None else scan_files(img_path)
    except FileNotFoundError as e:
        raise BadDataset(f"{prefix}{e}") from None
    label_files = source.label_files(im_files) if source is not None else img2label_paths(im_files)
    # an image's own label file is no stray entry: without an /images/ folder in the path it lies beside the image
    # (CVAT's YOLO 1.1 obj_<subset>_data/), where the scan meets it
    own = (source.own_files() if source is not None else set()) | set(label_files)
    ignored = [f"{f}: ignored, {why}" for f, why in others if f not in own]
    if not im_files:
        raise NoUsableImages(f"{prefix}no supported files found in {img_path} (formats: "
                             f"{', '.join(sorted(IMG_FORMATS))}; {len(others)} other files)", ignored)
    return im_files, label_files, ignored


class YOLODataset(Dataset):
    """Images + YOLO label files. `dataset[i]` is a dict (img uint8 (3, H, W) RGB, cls (n, 1), bboxes (n, 4)
    normalised xywh, path, shape, and what the label format adds, e.g. masks); `collate_fn` makes the batch of
    docs/design.md.

    task: the label format (data/label_formats.py) or its name, 'detect' or 'segment' (pose needs its
    `PoseLabels(kpt_shape, flip_idx)`).
    img_path: folder(s), glob(s) or list .txt file(s) of images; labels follow the /images/ -> /labels/ rule.
    cache: 'ram' (resized images in memory) or 'disk' (decoded pixels beside each image, x.jpg.yolo-engine.npy,
    read only then, rebuilt when older than the image or unreadable), for `cache_indices` only when given, else for
    this rank's share `rank_indices(n, world_size, rank, seed)` when world_size > 1, else all.
    Mosaic partners are drawn from that same share (from the sample's group of batches when the training loader
    asks for a group at once, `__getitems__`), so a DDP rank never reads images outside it.
    nc: an image with a class id >= nc is skipped while scanning (see data/labels.verify_image_label), unless
    `names_from` names the dataset YAML whose `names` gave nc: then any such label is an UnknownClasses error naming
    it and the first file (a `names` list one short would otherwise skip most of the images, as a warning);
    `problems` lists every skipped image and every note, `stats` counts them. single_cls: every label becomes
    class 0 (after the scan). names: {id: name}, which annotation files (COCO JSON, Pascal VOC XML:
    data/annotations.py) name their objects by; default class0, class1, ... for nc classes.
    device_hsv: leave the colour to the device (training on a GPU): each augmented sample carries the lookup tables
    of its drawn hue/saturation/value gains as 'hsv' (3, 256) uint8, the batch as (B, 3, 256), and the trainer
    applies them there (`augment.apply_hsv_batch`); otherwise the sample's pixels have them already.
    """

    def __init__(self, img_path, imgsz=640, batch_size=16, augment=False, hyp=None, rect=False, cache=None,
                 stride=32, pad=0.0, prefix="", task="detect", nc=None, cache_indices=None, rank=-1, world_size=1,
                 seed=0, single_cls=False, device_hsv=False, names=None, names_from=None):
        if cache not in (None, False, "ram", "disk"):
            raise ValueError(f"cache must be 'ram', 'disk' or None, got '{cache}'")
        self.imgsz, self.augment, self.rect, self.stride, self.prefix = imgsz, augment, rect, stride, prefix
        self.format = get_format(task)
        self.hyp = {**HYP_DEFAULTS, **(hyp or {})}  # a merged copy: the caller's dict is never modified
        self.mosaic = augment and not rect  # rect batches need each image's own aspect ratio
        self.device_hsv = device_hsv
        self.rng = SampleRNG(seed)
        source = label_source(img_path, self.format)  # COCO JSON or VOC XML labels; None: YOLO text files
        im_files, label_files, ignored = _listed_files(img_path, source, prefix)
        p = Path(img_path) if isinstance(img_path, (str, Path)) else None
        # a list file names its own cache; a folder, glob or single image uses its labels folder's, which lies beside
        # that folder: a cache named after an image would lie among the images, listed as ignored by later scans
        split = p if p is not None and p.is_file() and suffix(p) == "txt" else Path(label_files[0]).parent
        label_cache = source.cache_file if source else cache_path(split)
        labels, self.stats = cache_labels(im_files, label_files, label_cache,
                                          nc, prefix, fmt=self.format, source=source,
                                          names=names or {i: f"class{i}" for i in range(nc or 0)})
        self.problems = self.stats.pop("problems") + ignored
        if names_from is not None and self.stats["unknown_class"]:
            raise UnknownClasses(f"{prefix}{self.stats['unknown_class']} label files hold a class id >= nc {nc}, the "
                                 f"classes {names_from} names; the first: {self.stats['first_unknown_class']}; correct "
                                 f"its names (or the labels), or give --skip-unknown-classes to skip those images")
        self.stats["ignored"] = len(ignored) + self.stats["absent"]
        if ignored:
            LOGGER.warning(f"{prefix}WARNING: {len(ignored)} entries ignored, e.g. {ignored[0]}")
        if not len(labels["im_files"]):
            raise NoUsableImages(f"{prefix}no usable images in {img_path} ({self.stats['skipped']} skipped)",
                                 self.problems)
        # packed: forked loader workers share them instead of copying them as they read (data/label_store.py)
        self.labels = LabelStore.from_scan(labels, self.format)
        del labels
        release_heap()  # the scan's or the cache's transient copies, before workers fork from this process
        if single_cls:
            self.labels = self.labels.single_class()
        if augment and self.hyp["copy_paste"] and not self.labels.has_segments.any():
            LOGGER.warning(f"{prefix}WARNING: copy_paste {self.hyp['copy_paste']} has no effect: it pastes outlines, "
                           "and these labels have none (segment labels, or a polygon on every detection line)")
        self.im_files = self.labels.im_files
        if rect:
            self._set_rect_shapes(batch_size, stride, pad)
        n = len(self.labels)
        if cache_indices is None and world_size > 1:
            cache_indices = rank_indices(n, world_size, rank, seed)
        self.pool = np.arange(n) if cache_indices is None else np.unique(np.asarray(cache_indices, dtype=np.int64))
        self.ims = [None] * n
        self.disk_cache = cache == "disk"
        self.copies = DiskCopies(img_path, label_cache) if self.disk_cache else None  # where each .npy lies
        self.gone = set()  # images found missing after the scan (warned about once)
        if cache:
            self._cache_images(cache)

    def label_arrays(self):
        """(classes (n,), normalised xywh boxes (n, 4)) of every label, for the labels plot."""
        return self.labels.cls.reshape(-1).copy(), self.labels.bboxes.copy()

    def __len__(self):
        return len(self.labels)

    def close_mosaic(self):
        """Turn mosaic (and with it mixup) off, for the last epochs. A loader with persistent workers holds its
        own copies of the dataset, so rebuild the DataLoader after calling this."""
        self.mosaic = False

    # ------------------------------------------------------------------ images
    def _set_rect_shapes(self, batch_size, stride, pad):
        """Sort images by aspect ratio and give each batch the smallest stride-multiple shape that fits them."""
        hw = self.labels.shapes.astype(np.float64)
        ar = hw[:, 0] / hw[:, 1]
        order = ar.argsort(kind="stable")
        self.labels = self.labels.reordered(order)
        self.im_files = self.labels.im_files
        ar = ar[order]
        self.batch_index = np.arange(len(ar)) // batch_size
        # the ratios are sorted: a batch's lowest is its first, its highest its last (no scan of all per batch)
        lo, hi = ar[::batch_size], ar[np.minimum(np.arange(batch_size - 1, len(ar) + batch_size - 1, batch_size),
                                                 len(ar) - 1)]
        shapes = np.where((hi < 1)[:, None], np.stack([hi, np.ones_like(hi)], 1),
                          np.where((lo > 1)[:, None], np.stack([np.ones_like(lo), 1 / lo], 1), 1.0))
        self.batch_shapes = np.ceil(shapes * self.imgsz / stride + pad).astype(int) * stride

    def _read(self, i):
        im = read_disk_cache(self.copies(self.im_files[i]), self.im_files[i]) if self.disk_cache else None
        return self._decode(i) if im is None else im

    def _decode(self, i):
        try:
            im = read_image(self.im_files[i])
        except BadFile:  # swapped since the scan for one over the pixel limit, or for a FIFO
            im = None
        if im is None:
            raise ImageGone(self.im_files[i], i)
        return im

    def load_image(self, i):
        """Image i resized so its long side is imgsz: (BGR image, (h0, w0) original, (h, w) resized)."""
        if self.ims[i] is not None:
            return self.ims[i]
        im = self._read(i)
        h0, w0 = im.shape[:2]
        r = self.imgsz / max(h0, w0)
        if r != 1:
            # INTER_AREA keeps detail when shrinking for validation; training favours the faster INTER_LINEAR
            interp = cv2.INTER_LINEAR if (self.augment or r > 1) else cv2.INTER_AREA
            size = (min(math.ceil(w0 * r), self.imgsz), min(math.ceil(h0 * r), self.imgsz))
            im = cv2.resize(im, size, interpolation=interp)
        return im, (h0, w0), im.shape[:2]

    def _cache_images(self, mode):
        """This rank's share, judged against the budget before the first is decoded (data/image_cache.py)."""
        idx = self.pool.tolist()
        files, shapes = [self.im_files[i] for i in idx], [tuple(self.labels.shapes[i].tolist()) for i in idx]
        if mode == "disk":
            n = fill_disk(files, shapes, self.copies, lambda k: self._decode(idx[k]), self.prefix)
            LOGGER.info(f"{self.prefix}Cached {n} images to disk as .npy")
            return
        kept = [resized_shape(s, self.imgsz) for s in shapes]
        for i, x in zip(idx, fill_memory(files, shapes, lambda k: self.load_image(idx[k]), kept, self.prefix)):
            self.ims[i] = x
        cached = [self.ims[i][0].nbytes for i in idx if self.ims[i] is not None]
        LOGGER.info(f"{self.prefix}Cached {len(cached)}/{len(self.ims)} images in RAM ({sum(cached) / 1e9:.2f} GB)")

    # ------------------------------------------------------------------ samples
    def _instances(self, i, w, h, padw=0.0, padh=0.0):
        """Labels of image i in pixels of that image drawn at size (w, h) with offset (padw, padh)."""
        lb = self.labels[i]
        boxes = xywhn2xyxy(lb["bboxes"], w, h, padw, padh)
        segs = None if lb["segments"] is None else [xyn2xy(s, w, h, padw, padh) for s in lb["segments"]]
        kpts = lb.get("keypoints")
        if kpts is not None:
            kpts = np.concatenate([xyn2xy(kpts[..., :2], w, h, padw, padh), kpts[..., 2:]], -1)
        return Instances(lb["cls"][:, 0].copy(), boxes, segs, kpts)

    def load_mosaic(self, index, rng, pool, load):
        """Four images around a random centre of a 2s x 2s canvas, then warped and cropped back to s x s: image
        `index` and three drawn from `pool`, each read by `load` (`load_image`, or its memo for a group)."""
        s = self.imgsz
        xc, yc = (int(v) for v in rng.uniform(s // 2, 3 * s // 2, 2))
        indices = [index, *rng.choice(pool, 3)]
        rng.shuffle(indices)
        pieces, parts = [], []
        for k, i in enumerate(indices):  # k: 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right of the centre
            img, _, (h, w) = load(int(i))
            ox, oy = (xc - w if k in (0, 2) else xc), (yc - h if k in (0, 1) else yc)
            pieces.append((img, ox, oy))
            parts.append(self._instances(int(i), w, h, ox, oy))
        canvas = Canvas(2 * s, 2 * s, pieces)  # drawn by the warp, only where it reads
        inst = Instances.concat(parts)
        inst.clip(2 * s, 2 * s)
        if inst.segments is not None:
            for seg in inst.segments:
                np.clip(seg, 0, 2 * s, out=seg)
        canvas, inst = copy_paste(canvas, inst, self.hyp["copy_paste"], rng)
        return self._perspective(canvas, inst, rng, border=(-s // 2, -s // 2))

    def _perspective(self, img, inst, rng, border=(0, 0)):
        h = self.hyp
        return random_perspective(img, inst, h["degrees"], h["translate"], h["scale"], h["shear"],
                                  h["perspective"], border=border, rng=rng)

    def _letterboxed(self, index, rng, load):
        img, (h0, w0), (h, w) = load(index)
        shape = self.batch_shapes[self.batch_index[index]] if self.rect else self.imgsz
        img, ratio, pad = letterbox(img, shape, auto=False, scaleup=self.augment)
        shapes = ((h0, w0), ((h / h0 * ratio[1], w / w0 * ratio[0]), pad))  # maps predictions back to the original
        inst = self._instances(index, ratio[0] * w, ratio[1] * h, pad[0], pad[1])
        if self.augment:
            img, inst = self._perspective(img, inst, rng)
        return img, inst, shapes

    def __getitem__(self, index):
        """Sample `index`, its mosaic partners drawn from this rank's whole share."""
        return self._draw(index, self.pool, self.load_image)

    def __getitems__(self, indices):
        """The samples of one group of batches (data/loader.GroupedLoader), in one call: mosaic and mixup draw
        their partners among the group's own images, and each image is read and resized once for the group. The
        images are never written to: every sample copies them into its canvas or letterbox first."""
        loaded, gone = {}, set()

        def load(i):
            if i in gone:  # tried once for this group: not read again
                raise ImageGone(self.im_files[i], i)
            if i not in loaded:
                try:
                    loaded[i] = self.load_image(i)
                except ImageGone:
                    gone.add(i)
                    raise
            return loaded[i]

        pool = np.unique(np.asarray(indices, dtype=np.int64))
        return [self._draw(int(i), pool, load) for i in indices]

    def _draw(self, index, pool, load):
        """Sample `index`, other images drawn from `pool`; if an image it needs vanished since the scan, warn, leave
        it out of the pool and start again from another image of the pool (of the share, once the pool has none)."""
        rng = self.rng(index)
        missing = []
        for _ in range(MAX_SUBSTITUTES):
            try:
                return self._sample(index, rng, pool, load)
            except ImageGone as e:
                if str(e) not in self.gone:  # once per image and process
                    self.gone.add(str(e))
                    LOGGER.warning(f"{self.prefix}WARNING: {e}: image missing or unreadable since the scan, skipped")
                missing.append(e.index)
                pool = np.setdiff1d(pool, missing)
                if not len(pool):  # a small group whose images are all gone
                    pool = np.setdiff1d(self.pool, missing)
                if not len(pool):
                    break
                index = int(rng.choice(pool))
        raise BadDataset(f"{self.prefix}{len(missing)} images tried for one sample are missing or unreadable since the "
                         f"scan, e.g. {self.im_files[missing[0]]}")

    def _sample(self, index, rng, pool, load):
        hyp = self.hyp
        if self.mosaic and rng.random() < hyp["mosaic"]:
            img, inst = self.load_mosaic(index, rng, pool, load)
            shapes = None
            if rng.random() < hyp["mixup"]:
                img, inst = mixup(img, inst, *self.load_mosaic(int(rng.choice(pool)), rng, pool, load), rng)
        else:
            img, inst, shapes = self._letterboxed(index, rng, load)
        h, w = img.shape[:2]
        sample = {"path": self.im_files[index], "shape": shapes}
        if self.augment:
            gains = hsv_gains(hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"], rng)
            if gains is not None and self.device_hsv:
                sample["hsv"] = torch.from_numpy(hsv_tables(gains))
            elif gains is not None:
                apply_hsv(img, gains)
            if rng.random() < hyp["flipud"]:
                img = cv2.flip(img, 0)  # a contiguous copy: the planes below split fast only from one
                inst.flip(height=h)
            if rng.random() < hyp["fliplr"]:
                img = cv2.flip(img, 1)
                inst.flip(width=w, flip_idx=self.format.flip_idx)
        inst = self.format.add_to_sample(sample, inst, (h, w))
        sample["boxes"] = self.format.boxes(inst, (h, w))
        sample["cls"] = torch.from_numpy(inst.cls.astype(np.float32))
        sample["img"] = torch.from_numpy(chw_rgb(img))
        return sample

    def collate_fn(self, batch):
        """Samples -> {'img' (B, 3, H, W) uint8, 'targets' (data/targets.Targets: image index, cls, typed boxes,
        keypoints), 'paths', 'shapes'}, 'hsv' (B, 3, 256) with device_hsv, plus the label format's entries ('masks'
        (B, H/r, W/r) overlap maps or (N, H/r, W/r) for segment)."""
        out = {
            "img": torch.stack([b["img"] for b in batch]),
            "targets": Targets.collate(batch),
            "paths": tuple(b["path"] for b in batch),
            "shapes": tuple(b["shape"] for b in batch),
        }
        if "hsv" in batch[0]:
            out["hsv"] = torch.stack([b["hsv"] for b in batch])
        self.format.collate(batch, out)
        return out
