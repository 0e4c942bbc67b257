"""COCO JSON: class-id maps, prediction export, annotation JSON built from YOLO labels, pycocotools evaluation.

pycocotools is imported only when a function needs it, so the rest of the framework runs without it.
"""

import contextlib
import copy
import io
import json
from pathlib import Path

import numpy as np
import torch

from evaluation.metrics import OKS_AREA_SCALE
from utils.ops import xywhn2xyxy


def image_id_from_path(path):
    """COCO image id of an image file: int(stem) when the stem is numeric (COCO's own files), else the stem."""
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def _category(class_map, c):
    return int(class_map[c]) if class_map is not None else int(c)


def _numpy(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _pycocotools(module):
    # imported here: pycocotools is optional, needed only for --save-json evaluation and RLE masks
    try:
        if module == "mask":
            from pycocotools import mask

            return mask
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return COCO, COCOeval
    except ImportError as e:
        raise ImportError("COCO masks and evaluation need pycocotools: pip install pycocotools") from e


def box_to_coco_json(predn, image_id, class_map=None):
    """Detections of one image as COCO result dicts (the fields of evaluation/fields.py add their own keys to them).

    predn: (n, 6) xyxy, conf, cls in original-image pixels. class_map: category id per class index (None: the
    class index itself).
    """
    predn = _numpy(predn)
    out = []
    for x1, y1, x2, y2, conf, c in predn[:, :6].tolist():
        d = {
            "image_id": image_id,
            "category_id": _category(class_map, int(c)),
            "bbox": [round(v, 3) for v in (x1, y1, x2 - x1, y2 - y1)],
            "score": round(conf, 5),
        }
        out.append(d)
    return out


def coco_keypoints(keypoints):
    """Keypoints (n, K, 2 or 3) as COCO results' `keypoints` lists, x y score per keypoint, rounded as the boxes; the
    score is the visibility probability, 1 without one."""
    kpts = _numpy(keypoints).astype(np.float64)
    if kpts.shape[-1] == 2:
        kpts = np.concatenate([kpts, np.ones_like(kpts[..., :1])], -1)
    return [[round(v, 3) for v in k.reshape(-1).tolist()] for k in kpts]


def masks_to_rle(masks):
    """Binary masks (n, h, w) -> list of COCO RLE dicts {'size': [h, w], 'counts': str}."""
    mask_utils = _pycocotools("mask")
    masks = _numpy(masks)
    if not len(masks):
        return []
    rles = mask_utils.encode(np.asfortranarray(masks.astype(np.uint8).transpose(1, 2, 0)))  # wants (h, w, n), F order
    for r in rles:
        r["counts"] = r["counts"].decode("utf-8")  # bytes are not JSON serialisable
    return rles


def _polygon_area(xy):
    x, y = xy[:, 0], xy[:, 1]
    return float(abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))) / 2)


def _annotation(ann_id, image_id, category_id, box, segment=None, mask=None, keypoints=None):
    """One COCO annotation; with `keypoints` (K, 3) pixels its area is the box's times OKS_AREA_SCALE, the area the
    validator's OKS uses (COCO's person areas are their segmentations')."""
    x1, y1, x2, y2 = (float(v) for v in box)
    ann = {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [x1, y1, x2 - x1, y2 - y1],
        "area": (x2 - x1) * (y2 - y1),
        "iscrowd": 0,
    }
    if segment is not None:
        ann["segmentation"] = [segment.reshape(-1).tolist()]
        ann["area"] = _polygon_area(segment)
    elif mask is not None:
        ann["segmentation"] = masks_to_rle(mask[None])[0]
        ann["area"] = float(mask.sum())
    if keypoints is not None:
        ann["keypoints"] = [float(v) for v in keypoints.reshape(-1)]
        ann["num_keypoints"] = int((keypoints[:, 2] > 0).sum())
        ann["area"] *= OKS_AREA_SCALE
    return ann


def labels_to_coco_json(labels, names, class_map=None):
    """Build a COCO annotation dict from YOLO labels, to evaluate any dataset with pycocotools.

    labels: a YOLODataset (its .labels are used) or a list with one dict per image: im_file, shape (h, w) of the
    original image, cls (n, 1), bboxes (n, 4) normalised xywh, and optionally segments (n polygons (k, 2)
    normalised, or None) or masks (n, h, w) binary at the original size (written as RLE), or keypoints (n, K, 3)
    normalised with visibility. Image ids come from
    image_id_from_path(im_file), as the validators' prediction JSON. names: class names (list or {index: name}).
    class_map as in box_to_coco_json.
    """
    labels = getattr(labels, "labels", labels)
    names = names if isinstance(names, dict) else dict(enumerate(names))
    images, annotations = [], []
    for lb in labels:
        image_id = image_id_from_path(lb["im_file"])
        h, w = lb["shape"]
        images.append({"id": image_id, "width": int(w), "height": int(h), "file_name": Path(lb["im_file"]).name})
        cls = _numpy(lb["cls"]).reshape(-1)
        boxes = xywhn2xyxy(_numpy(lb["bboxes"]).reshape(-1, 4).astype(np.float64), w, h)
        segments, masks, kpts = lb.get("segments"), lb.get("masks"), lb.get("keypoints")
        for j, (c, box) in enumerate(zip(cls, boxes)):
            seg = None
            if segments is not None and segments[j] is not None:
                seg = np.asarray(segments[j], dtype=np.float64) * (w, h)
            mask = _numpy(masks[j]) if masks is not None else None
            kpt = None
            if kpts is not None:
                kpt = _numpy(kpts[j]).astype(np.float64) * (w, h, 1)
                kpt[kpt[:, 2] == 0, :2] = 0  # COCO's unlabelled keypoint: 0 0 0
            cat = _category(class_map, int(c))
            annotations.append(_annotation(len(annotations) + 1, image_id, cat, box, seg, mask, kpt))
    categories = [{"id": _category(class_map, i), "name": str(n)} for i, n in sorted(names.items())]
    return {
        "info": {"description": "converted from YOLO labels"},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }


def _coco_gt(anno, COCO):
    gt = COCO()
    gt.dataset = copy.deepcopy(anno) if isinstance(anno, dict) else json.loads(Path(anno).read_text())
    return gt


def _ids_as_str(anno, preds, img_ids):
    """Numeric and named image ids side by side (image_id_from_path gives both) make pycocotools fail when it
    sorts them: turn every id into a string, in the ground truth, the results and the selection alike."""
    for d in anno["images"]:
        d["id"] = str(d["id"])
    for d in anno["annotations"] + preds:
        d["image_id"] = str(d["image_id"])
    return None if img_ids is None else [str(i) for i in img_ids]


def eval_coco_json(anno_json, pred_json, iou_type="bbox", img_ids=None, max_dets=100, verbose=False, kpt_sigmas=None):
    """Evaluate COCO results with pycocotools; returns (mAP50-95, mAP50).

    iou_type 'keypoints' matches by OKS with `kpt_sigmas` (pycocotools' default: COCO's 17 person sigmas); pycocotools
    keeps 20 detections per image for keypoints by default, here `max_dets`.
    anno_json / pred_json: file paths or the loaded objects (annotation dict / list of result dicts).
    img_ids restricts the evaluation to those images (the ones the loader saw). max_dets is COCO's per-image,
    per-category cap (its default 100). verbose prints pycocotools' own summary table.
    """
    COCO, COCOeval = _pycocotools("eval")
    # loadRes edits the dicts it is given: a caller's are copied, those read here are ours (a deep copy of 440,000
    # rows took seconds)
    if isinstance(pred_json, (str, Path)):
        preds = json.loads(Path(pred_json).read_text())
    else:
        preds = copy.deepcopy(list(pred_json))
    if not len(preds):
        return 0.0, 0.0  # pycocotools cannot load an empty result list; nothing detected scores zero
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        gt = _coco_gt(anno_json, COCO)
        if len({type(d["id"]) for d in gt.dataset["images"]}) > 1:
            img_ids = _ids_as_str(gt.dataset, preds, img_ids)
        gt.createIndex()
        dt = gt.loadRes(preds)
        ev = COCOeval(gt, dt, iou_type)
        if img_ids is not None:
            ev.params.imgIds = list(img_ids)
        if iou_type == "keypoints":
            if kpt_sigmas is not None:
                ev.params.kpt_oks_sigmas = np.asarray(kpt_sigmas, dtype=np.float64)
            ev.params.maxDets = sorted({20, max_dets})  # summarize() reads its 20
        else:
            ev.params.maxDets = [1, 10, max_dets]
        ev.evaluate()
        ev.accumulate()
        if verbose:
            ev.summarize()
    # Read the precision table directly: summarize() hard-codes maxDets=100 for its first figure.
    precision = ev.eval["precision"][:, :, :, 0, -1]  # (iou, recall, class) at area 'all', the largest maxDets
    at50 = np.isclose(ev.params.iouThrs, 0.5)
    return _valid_mean(precision), _valid_mean(precision[at50])


def _valid_mean(p):
    """Mean over entries pycocotools filled (it marks classes without ground truth with -1)."""
    p = p[p > -1]
    return float(p.mean()) if p.size else 0.0
