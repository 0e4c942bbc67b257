"""Image-folder classification dataset (root/<class>/*.jpg) with v8-style train and val transforms."""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from data.augment import SampleRNG, augment_hsv, chw_rgb
from data.image_cache import fill_disk, fill_memory, header_shape
from data.image_files import class_folders, disk_cache_path, files_hash, read_disk_cache, scan_files
from data.label_cache import cache_path, load_cache, save_cache
from data.labels import CACHE_VERSION, NoUsableImages, log_problems, read_image, verify_image
from data.loader import rank_indices
from utils.errors import BadDataset, BadFile
from utils.log import LOGGER


def to_float_tensor(im_bgr):
    """BGR HWC uint8 numpy -> RGB CHW float32 tensor in [0, 1]."""
    return torch.from_numpy(chw_rgb(im_bgr)).float().div_(255)


def _resize(im, size_wh):
    shrink = size_wh[0] * size_wh[1] < im.shape[0] * im.shape[1]
    return cv2.resize(im, size_wh, interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def classify_val_transforms(imgsz):
    """Resize the shorter side to imgsz, then centre-crop imgsz x imgsz (official v8 val/predict):
    BGR uint8 numpy in, RGB float32 (3, imgsz, imgsz) tensor in [0, 1] out."""

    def transform(im):
        h, w = im.shape[:2]
        r = imgsz / min(h, w)
        nw, nh = max(imgsz, int(round(w * r))), max(imgsz, int(round(h * r)))
        im = _resize(im, (nw, nh))
        top, left = int(round((nh - imgsz) / 2)), int(round((nw - imgsz) / 2))
        return to_float_tensor(im[top : top + imgsz, left : left + imgsz])

    return transform


class ClassifyTrainTransforms:
    """Random resized crop (area scale (1 - hyp['scale'], 1), default (0.08, 1); aspect 3/4..4/3), flips and HSV
    gains from the hyp dict, done with OpenCV lookups (torchvision's tensor ColorJitter is ~10x slower on CPU).
    Call with a BGR uint8 image and a numpy Generator; returns an RGB float32 tensor in [0, 1]."""

    # the hyp keys it reads (engine/hyp.py checks files against them), and the defaults of those a dict leaves out
    hyp_keys = {"scale": "[0, 1)", "fliplr": "[0, 1]", "flipud": "[0, 1]", "hsv_h": "[0, 1]", "hsv_s": "[0, 1]",
                "hsv_v": "[0, 1]"}
    hyp_defaults = {"scale": 0.92, "fliplr": 0.5, "flipud": 0.0, "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4}

    def __init__(self, imgsz, hyp=None):
        hyp = {**self.hyp_defaults, **(hyp or {})}
        self.imgsz = imgsz
        self.scale = (1.0 - hyp["scale"], 1.0)
        self.log_ratio = (math.log(3 / 4), math.log(4 / 3))
        self.fliplr, self.flipud = hyp["fliplr"], hyp["flipud"]
        self.hsv = (hyp["hsv_h"], hyp["hsv_s"], hyp["hsv_v"])

    def crop_box(self, h, w, rng):
        """(top, left, height, width) of a random crop, as torchvision's RandomResizedCrop draws it."""
        for _ in range(10):
            area = h * w * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*self.log_ratio))
            cw, ch = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
        ch, cw = h, w  # fallback: the whole image, trimmed to the allowed aspect range
        if w / h < 3 / 4:
            ch = int(round(w / (3 / 4)))
        elif w / h > 4 / 3:
            cw = int(round(h * 4 / 3))
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, im, rng):
        top, left, ch, cw = self.crop_box(*im.shape[:2], rng)
        im = _resize(im[top : top + ch, left : left + cw], (self.imgsz, self.imgsz))
        if rng.random() < self.fliplr:
            im = im[:, ::-1]
        if rng.random() < self.flipud:
            im = im[::-1]
        im = augment_hsv(np.ascontiguousarray(im), *self.hsv, rng=rng)
        return to_float_tensor(im)


class ClassificationDataset(Dataset):
    """root/<class>/**/*.jpg. `names` {id: class name} is the class map every split shares (the training split's, or
    a checkpoint's); without it, the sorted folder names here. A folder not in the map is a BadDataset naming it; a
    class of the map without a folder here simply has no images in this split. Unreadable images are found once
    (the result is cached in `<root>.yolo-engine.cache`), skipped and counted; files that are not images, or not
    inside a class folder, are listed in `problems` too. `dataset[i]` -> {'img': float32 (3, imgsz, imgsz),
    'cls': int}, with ClassifyTrainTransforms when augment, else classify_val_transforms.

    cache: 'ram' or 'disk' (decoded pixels beside each image, x.jpg.yolo-engine.npy, read only then, rebuilt when
    older than the image or unreadable), limited to `cache_indices`, or to this rank's share when world_size > 1.
    """

    def __init__(self, root, imgsz=224, augment=False, hyp=None, cache=None, prefix="", cache_indices=None,
                 rank=-1, world_size=1, seed=0, names=None):
        if cache not in (None, False, "ram", "disk"):
            raise ValueError(f"cache must be 'ram', 'disk' or None, got '{cache}'")
        self.root, self.prefix = Path(root), prefix
        if not self.root.is_dir():
            raise BadDataset(f"{prefix}{root} is not a folder")
        self.names = self._class_map(names)
        candidates, ignored = self._candidates()
        self.samples, self.stats, self.problems = self._verify(candidates)
        self.problems += ignored
        self.stats["ignored"] = len(ignored)
        if not self.samples:
            raise NoUsableImages(f"{prefix}no readable images in {root}", self.problems)
        self.train_transform = ClassifyTrainTransforms(imgsz, hyp) if augment else None
        self.val_transform = classify_val_transforms(imgsz)
        self.rng = SampleRNG(seed)
        n = len(self.samples)
        if cache_indices is None and world_size > 1:
            cache_indices = rank_indices(n, world_size, rank, seed)
        self.cache_indices = np.arange(n) if cache_indices is None else np.unique(np.asarray(cache_indices))
        self.ims = [None] * n
        self.disk_cache = cache == "disk"
        self.npy_files = [disk_cache_path(f) for f, _ in self.samples]
        if cache:
            self._cache_images(cache)

    def _class_map(self, names):
        folders = class_folders(self.root)
        if names is None:
            if not folders:
                raise BadDataset(f"{self.prefix}{self.root} has no class folders")
            return dict(enumerate(folders))
        unknown = [f for f in folders if f not in names.values()]
        if unknown:
            raise BadDataset(f"{self.prefix}{self.root}: class folder(s) {', '.join(map(repr, unknown))} not among "
                             f"the {len(names)} classes {', '.join(names.values())}")
        return dict(names)

    def _candidates(self):
        """[(image path, class id)] of the class folders, and the problem lines of every other entry under root."""
        ids, hidden = {name: c for c, name in self.names.items()}, []
        candidates, ignored = [], []
        for name in class_folders(self.root, hidden):
            files, others = scan_files(self.root / name)
            candidates += [(f, ids[name]) for f in files]
            ignored += [f"{f}: ignored, {why}" for f, why in others]
        ignored += [f"{f}: ignored, a hidden folder is no class" for f in sorted(hidden)]
        loose = sorted(str(f) for f in self.root.iterdir() if not f.is_dir())
        ignored += [f"{f}: ignored, not inside a class folder" for f in loose]
        return candidates, ignored

    def _verify(self, candidates):
        files = [f for f, _ in candidates]
        cache_file = cache_path(self.root)
        hash_ = files_hash(files, extra=f"{CACHE_VERSION} classify")
        n = len(files)
        cache = load_cache(cache_file, hash_, self.prefix,
                           valid=lambda d: all(type(i) is int and 0 <= i < n for i in d["good"]))
        cached = cache is not None
        if not cached:
            workers = min(8, os.cpu_count() or 1)
            with ThreadPoolExecutor(workers) as pool:
                errors = list(pool.map(_image_error, files))
            msgs = [f"{f}: skipped, {e}" for f, e in zip(files, errors) if e]
            good = [i for i, e in enumerate(errors) if not e]
            cache = {"version": CACHE_VERSION, "hash": hash_, "good": good, "msgs": msgs}
            save_cache(cache_file, cache, hash_, self.prefix)
        samples = [candidates[i] for i in cache["good"]]
        present, folders = {c for _, c in samples}, set(class_folders(self.root))
        empty = [f"{self.root / name}: skipped, class folder has no readable image"
                 for c, name in self.names.items() if c not in present and name in folders]
        absent = [name for name in self.names.values() if name not in folders]
        stats = {"images": len(samples), "skipped": len(candidates) - len(samples), "empty_classes": len(empty),
                 "absent_classes": len(absent), "cached": cached}
        LOGGER.info(
            f"{self.prefix}Scanning {self.root}... {stats['images']} images, {stats['skipped']} skipped, "
            f"{len(self.names)} classes ({len(empty)} without images)" + (" (cached)" if cached else "")
        )
        if absent:
            LOGGER.info(f"{self.prefix}no folder here for class(es) {', '.join(absent)}: no images of them in "
                        f"{self.root}")
        problems = empty + cache["msgs"]
        log_problems(problems, stats["skipped"], self.prefix)
        return samples, stats, problems

    def _read(self, i):
        im = read_disk_cache(self.npy_files[i], self.samples[i][0]) if self.disk_cache else None
        return self._decode(i) if im is None else im

    def _decode(self, i):
        try:
            im = read_image(self.samples[i][0])
        except BadFile:  # swapped since the scan for one over the pixel limit, or for a FIFO
            im = None
        if im is None:
            raise FileNotFoundError(f"{self.prefix}image not found or unreadable: {self.samples[i][0]}")
        return im

    def _cache_images(self, mode):
        """This rank's share, whole, judged against the budget from the images' headers before the first is decoded
        (data/image_cache.py); every image lies in its class folder, so each copy lies beside it."""
        idx = self.cache_indices.tolist()
        files = [self.samples[i][0] for i in idx]
        shapes = [header_shape(f) or (0, 0) for f in files]
        if mode == "disk":
            n = fill_disk(files, shapes, disk_cache_path, lambda k: self._decode(idx[k]), self.prefix)
        else:
            for i, im in zip(idx, fill_memory(files, shapes, lambda k: self._read(idx[k]), prefix=self.prefix)):
                self.ims[i] = im
            n = sum(self.ims[i] is not None for i in idx)
        LOGGER.info(f"{self.prefix}Cached {n}/{len(self.samples)} images ({mode})")

    def label_arrays(self):
        """(classes (n,), None): one label per image and no boxes, for the labels plot."""
        return np.array([c for _, c in self.samples], dtype=int), None

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        im = self.ims[i] if self.ims[i] is not None else self._read(i)
        img = self.train_transform(im, self.rng(i)) if self.train_transform else self.val_transform(im)
        return {"img": img, "cls": self.samples[i][1]}

    @staticmethod
    def collate_fn(batch):
        """-> {'img': float32 (B, 3, H, W) in [0, 1], 'cls': int64 (B,)}"""
        return {
            "img": torch.stack([b["img"] for b in batch]),
            "cls": torch.tensor([b["cls"] for b in batch], dtype=torch.int64),
        }


def _image_error(path):
    try:
        verify_image(path)
        return ""
    except (ValueError, OSError) as e:
        return str(e)
