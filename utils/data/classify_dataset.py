"""Image-folder classification dataset (root/<class>/*.jpg) with v8-style train and val transforms."""

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2 as T

from utils.data.image_files import IMG_FORMATS, files_hash, suffix
from utils.data.labels import CACHE_VERSION, MAX_WARNINGS, load_cache, read_image, save_cache, verify_image
from utils.data.loader import rank_indices

LOGGER = logging.getLogger("yolo")


def to_rgb_tensor(im_bgr):
    """BGR HWC uint8 numpy -> RGB CHW uint8 tensor."""
    return torch.from_numpy(np.ascontiguousarray(cv2.cvtColor(im_bgr, cv2.COLOR_BGR2RGB).transpose(2, 0, 1)))


def classify_train_transforms(imgsz, hyp=None):
    """Random resized crop (scale (1 - hyp['scale'], 1), default (0.08, 1)), flips, colour jitter from the HSV gains;
    uint8 RGB CHW tensor in, float32 [0, 1] out."""
    hyp = hyp or {}
    scale = (1.0 - hyp["scale"], 1.0) if "scale" in hyp else (0.08, 1.0)
    ops = [T.RandomResizedCrop(imgsz, scale=scale, ratio=(3 / 4, 4 / 3), antialias=True)]
    if hyp.get("fliplr", 0.5) > 0:
        ops.append(T.RandomHorizontalFlip(hyp.get("fliplr", 0.5)))
    if hyp.get("flipud", 0.0) > 0:
        ops.append(T.RandomVerticalFlip(hyp["flipud"]))
    v, s, h = hyp.get("hsv_v", 0.4), hyp.get("hsv_s", 0.7), min(hyp.get("hsv_h", 0.015), 0.5)
    if v or s or h:
        ops.append(T.ColorJitter(brightness=v, contrast=v, saturation=s, hue=h))
    ops.append(T.ToDtype(torch.float32, scale=True))
    return T.Compose(ops)


def classify_val_transforms(imgsz):
    """Resize the shorter side to imgsz, centre-crop imgsz x imgsz (official v8 val); float32 [0, 1] out."""
    return T.Compose([T.Resize(imgsz, antialias=True), T.CenterCrop(imgsz), T.ToDtype(torch.float32, scale=True)])


def classify_predict_transforms(imgsz):
    """The val transform taking a BGR numpy image, for sources.LoadImages(transforms=...)."""
    tf = classify_val_transforms(imgsz)
    return lambda im_bgr: tf(to_rgb_tensor(im_bgr))


class ClassificationDataset(Dataset):
    """root/<class>/**/*.jpg; classes are the sorted folder names. Unreadable images are found once (the result is
    cached in `<root>.cache`), skipped and counted. `dataset[i]` -> {'img': float32 (3, imgsz, imgsz), 'cls': int}.

    cache: 'ram' or 'disk' (.npy), limited to `cache_indices`, or to this rank's share when world_size > 1.
    """

    def __init__(self, root, imgsz=224, augment=False, hyp=None, cache=None, prefix="", cache_indices=None,
                 rank=-1, world_size=1, seed=0):
        if cache not in (None, False, "ram", "disk"):
            raise ValueError(f"cache must be 'ram', 'disk' or None, got '{cache}'")
        self.root, self.prefix = Path(root), prefix
        if not self.root.is_dir():
            raise FileNotFoundError(f"{prefix}{root} is not a folder")
        classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        if not classes:
            raise FileNotFoundError(f"{prefix}{root} has no class folders")
        self.names = dict(enumerate(classes))
        candidates = [
            (str(f), c)
            for c, name in enumerate(classes)
            for f in sorted((self.root / name).rglob("*"))
            if f.is_file() and suffix(f) in IMG_FORMATS
        ]
        self.samples, self.stats = self._verify(candidates)
        if not self.samples:
            raise FileNotFoundError(f"{prefix}no readable images in {root}")
        self.transform = classify_train_transforms(imgsz, hyp) if augment else classify_val_transforms(imgsz)
        n = len(self.samples)
        if cache_indices is None and world_size > 1:
            cache_indices = rank_indices(n, world_size, rank, seed)
        self.cache_indices = np.arange(n) if cache_indices is None else np.unique(np.asarray(cache_indices))
        self.ims = [None] * n
        self.npy_files = [Path(f).with_suffix(".npy") for f, _ in self.samples]
        if cache:
            self._cache_images(cache)

    def _verify(self, candidates):
        files = [f for f, _ in candidates]
        cache_path = self.root.parent / f"{self.root.name}.cache"
        hash_ = files_hash(files, extra=f"{CACHE_VERSION} classify")
        cache = load_cache(cache_path, hash_)
        cached = cache is not None
        if not cached:
            workers = min(8, os.cpu_count() or 1)
            with ThreadPoolExecutor(workers) as pool:
                errors = list(pool.map(_image_error, files))
            msgs = [f"{f}: skipped, {e}" for f, e in zip(files, errors) if e]
            good = [i for i, e in enumerate(errors) if not e]
            cache = {"version": CACHE_VERSION, "hash": hash_, "good": good, "msgs": msgs}
            save_cache(cache_path, cache, self.prefix)
        samples = [candidates[i] for i in cache["good"]]
        stats = {"images": len(samples), "corrupt": len(candidates) - len(samples), "cached": cached}
        LOGGER.info(
            f"{self.prefix}Scanning {self.root}... {stats['images']} images, {stats['corrupt']} corrupt, "
            f"{len(self.names)} classes" + (" (cached)" if cached else "")
        )
        for m in cache["msgs"][:MAX_WARNINGS]:
            LOGGER.warning(f"{self.prefix}WARNING: {m}")
        return samples, stats

    def _read(self, i):
        if self.npy_files[i].is_file():
            return np.load(self.npy_files[i])
        im = read_image(self.samples[i][0])
        if im is None:
            raise FileNotFoundError(f"{self.prefix}image not found or unreadable: {self.samples[i][0]}")
        return im

    def _cache_images(self, mode):
        idx = self.cache_indices.tolist()
        with ThreadPoolExecutor(8) as pool:
            if mode == "disk":
                list(pool.map(lambda i: self.npy_files[i].is_file() or np.save(self.npy_files[i], self._read(i)), idx))
            else:
                for i, im in zip(idx, pool.map(self._read, idx)):
                    self.ims[i] = im
        LOGGER.info(f"{self.prefix}Cached {len(idx)}/{len(self.samples)} images ({mode})")

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        im = self.ims[i] if self.ims[i] is not None else self._read(i)
        return {"img": self.transform(to_rgb_tensor(im)), "cls": self.samples[i][1]}

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
