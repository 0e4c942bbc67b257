"""Validation at scale (issue 60), ours against Ultralytics: NMS, matching, mAP and the COCO predictions JSON of N
images, each stage through each tool's own validator functions, on the same synthetic head outputs and labels.

    python -m benchmarks.scale_val --images 1000 5000 20000 --repeats 3 [--coco]

`make` draws, from one seed, N images' original shapes (long side 320-1280 px, letterboxed to 640) and labels (80
classes, Poisson(7) objects an image), and a v8 head's raw eval output (B, 84, 8400) for each: around each label a
cluster of anchors of its class (most of them suppressed by NMS, a few surviving as duplicates) with a box off by a
random few percent of its size, some of another class, plus false objects at random places, classes and low scores,
and a second class on a tenth of the anchors; about 89 detections an image survive NMS at conf 0.001,
IoU 0.7. They are stored compactly (candidate anchors and their class scores) in an .npz in a scratch folder
(never committed); each run expands the same arrays batch by batch (32 images) into the dense tensors both sides
take, outside the timed stages.

Each run is one whole process per side, the sides alternated, medians of --repeats reported; each stage is timed as
the validator runs it per batch or once: (a) NMS of each batch (ours: BoxValidator.postprocess; theirs:
DetectionValidator.postprocess, ultralytics.utils.nms); (b) each image's labels, IoU, matching at the ten IoU
thresholds and confusion matrix, its record kept (ours: BoxValidator.update_metrics; theirs: its update_metrics,
plots on for the confusion matrix, as a default val); (c) mAP from the kept records (ours: the records' merge and
get_stats; theirs: DetMetrics.process without drawing); (d) the COCO predictions JSON: each image's rows scaled to
the original image and written as dicts, then the file (ours: BoxValidator's pred_to_json and write_predictions;
theirs: scale_preds, pred_to_json, json.dump); (e) with --coco, pycocotools' evaluation of that file against the
labels (both sides call pycocotools; reported, not compared). `agreement` checks that the timings compare the same
work: the same NMS rows, each row matched alike, and the same mAP50-95 under one AP rule (the tools' rules differ).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.scale import PEERS, run_side

SIDES = ["ours", "ultralytics"]
STAGES = ["nms", "match", "map", "json", "coco"]
NC, IMGSZ, ANCHORS, BATCH = 80, 640, 8400, 32
CONF, IOU, MAX_DET = 0.001, 0.7, 300


# ---------------------------------------------------------------- the synthetic data (numpy only: both venvs run it)
def _letterbox(h0, w0):
    """(gain, pad_w, pad_h) of an image of (h0, w0) fitted into IMGSZ x IMGSZ, the pad centred."""
    g = min(IMGSZ / h0, IMGSZ / w0)
    return float(g), (IMGSZ - round(w0 * g)) / 2, (IMGSZ - round(h0 * g)) / 2


def _random_boxes(rng, n, h, w, lo=0.03, hi=0.6):
    """n xyxy boxes inside (h, w), sides a log-uniform fraction of the long side."""
    long = max(h, w)
    bw = np.minimum(long * np.exp(rng.uniform(np.log(lo), np.log(hi), n)), w - 1)
    bh = np.minimum(bw * np.exp(rng.normal(0, 0.5, n)), h - 1)
    x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
    return np.stack((x1, y1, x1 + bw, y1 + bh), 1)


def _jitter(rng, xyxy, spread, content):
    """Boxes with each side moved by a normal fraction `spread` (per box) of the box's size, clipped to the image's
    `content` (x1, y1, x2, y2) in the input: ours matches after clipping to the original image, Ultralytics in the
    input unclipped, so a box reaching into the padding would be matched differently (see `agreement`)."""
    wh = np.concatenate((xyxy[:, 2:] - xyxy[:, :2],) * 2, 1)
    lo, hi = np.tile(content[:2], 2), np.tile(content[2:], 2)
    return np.clip(xyxy + rng.normal(0, 1, xyxy.shape) * spread[:, None] * wh, lo, hi)


def _objects(rng, gt_in, gt_cls, content):
    """The objects an image's output holds (xyxy input pixels, class, score): one for most labels (its class
    mostly, near its box, scores high), and 45-75 false ones (anywhere in the image, any class, scores low)."""
    found = rng.random(len(gt_cls)) < 0.9
    cls = np.where(rng.random(len(gt_cls)) < 0.92, gt_cls, rng.integers(0, NC, len(gt_cls)))[found]
    boxes = _jitter(rng, gt_in[found], rng.uniform(0.02, 0.15, found.sum()), content)
    scores = rng.beta(5, 2, found.sum())
    n_fp = rng.integers(45, 75)
    fp_boxes = _random_boxes(rng, n_fp, content[3] - content[1], content[2] - content[0]) + np.tile(content[:2], 2)
    fp_scores = np.minimum(0.0011 + rng.exponential(0.05, n_fp), 0.9)
    return (np.concatenate((boxes, fp_boxes)), np.concatenate((cls, rng.integers(0, NC, n_fp))),
            np.concatenate((scores, fp_scores)))


def _image(rng, h0, w0):
    """One image's labels (cls, xyxy original pixels) and its candidate anchors: (anchor, xywh input pixels) and
    their (candidate, class, score) pairs."""
    m = rng.poisson(7)
    gt = _random_boxes(rng, m, h0, w0)
    gt_cls = rng.integers(0, NC, m)
    g, pw, ph = _letterbox(h0, w0)
    content = np.array([pw, ph, IMGSZ - pw, IMGSZ - ph])
    boxes, cls, scores = _objects(rng, gt * g + np.array([pw, ph, pw, ph]), gt_cls, content)
    size = 1 + rng.poisson(3, len(cls))  # anchors an object lights
    obj = np.repeat(np.arange(len(cls)), size)
    lead = np.r_[0, np.cumsum(size)[:-1]]
    spread = np.full(len(obj), 0.03)
    spread[lead] = 0
    xyxy = _jitter(rng, boxes[obj], spread, content)
    score = scores[obj] * np.where(spread == 0, 1, rng.uniform(0.3, 1, len(obj)))
    xywh = np.concatenate(((xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]), 1)
    second = np.flatnonzero(rng.random(len(obj)) < 0.1)
    pair_cand = np.concatenate((np.arange(len(obj)), second))
    pair_cls = np.concatenate((cls[obj], rng.integers(0, NC, len(second))))
    pair_score = np.concatenate((score, score[second] * rng.uniform(0.05, 0.5, len(second))))
    keep = (pair_score > CONF * 1.1) & ~np.r_[np.zeros(len(obj), bool), pair_cls[len(obj):] == cls[obj][second]]
    anchors = rng.choice(ANCHORS, len(obj), replace=False)
    return (gt_cls, gt), (anchors, xywh), (pair_cand[keep], pair_cls[keep], pair_score[keep])


def make(n, path, seed=0):
    """Write N images' synthetic labels and head outputs to `path` (.npz); see the module's docstring."""
    rng = np.random.default_rng(seed)
    long = rng.integers(320, 1281, n)
    short = (long * rng.uniform(0.5, 1, n)).astype(int)
    portrait = rng.random(n) < 0.3
    shapes = np.stack((np.where(portrait, long, short), np.where(portrait, short, long)), 1)
    parts = {k: [] for k in ("gt_cls", "gt_xyxy", "anchor", "xywh", "pair_cand", "pair_cls", "pair_score")}
    counts = np.zeros((n, 3), dtype=np.int64)
    for i, (h0, w0) in enumerate(shapes):
        (gc, gb), (a, xywh), (pc, pcl, ps) = _image(rng, h0, w0)
        for k, v in zip(parts, (gc, gb, a, xywh, pc, pcl, ps)):
            parts[k].append(v)
        counts[i] = len(gc), len(a), len(pc)
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    np.savez(path, shapes=shapes, counts=counts, gt_cls=arrays["gt_cls"].astype(np.int64),
             gt_xyxy=arrays["gt_xyxy"].astype(np.float32), anchor=arrays["anchor"].astype(np.int64),
             xywh=arrays["xywh"].astype(np.float32), pair_cand=arrays["pair_cand"].astype(np.int64),
             pair_cls=arrays["pair_cls"].astype(np.int64), pair_score=arrays["pair_score"].astype(np.float32))
    return path


class Data:
    """The stored arrays, cut into batches: `output(b)` the dense head output, `labels(b)` the YOLO batch rows."""

    def __init__(self, path):
        z = np.load(path)
        self.shapes, counts = z["shapes"], z["counts"]
        self.n = len(self.shapes)
        self.off = np.vstack((np.zeros((1, 3), np.int64), np.cumsum(counts, 0)))
        self.z = {k: z[k] for k in z.files}

    def batches(self):
        return [(s, min(s + BATCH, self.n)) for s in range(0, self.n, BATCH)]

    def output(self, start, stop):
        """(B, 4 + NC, ANCHORS) float32: each candidate anchor's xywh and class scores, zeros elsewhere."""
        z, off = self.z, self.off
        # written whole (np.zeros would leave its pages unmapped until NMS reads them, a model's output is written)
        out = np.full((stop - start, 4 + NC, ANCHORS), 0, dtype=np.float32)
        c0, c1 = off[start, 1], off[stop, 1]
        img = np.repeat(np.arange(stop - start), np.diff(off[start:stop + 1, 1]))
        out[img[:, None], np.arange(4)[None], z["anchor"][c0:c1, None]] = z["xywh"][c0:c1]
        p0, p1 = off[start, 2], off[stop, 2]
        local = np.repeat(np.arange(stop - start), np.diff(off[start:stop + 1, 2]))
        cand = z["pair_cand"][p0:p1] + (off[start:stop, 1] - c0)[local]
        out[img[cand], 4 + z["pair_cls"][p0:p1], z["anchor"][c0:c1][cand]] = z["pair_score"][p0:p1]
        return out

    def labels(self, start, stop):
        """(image in batch, cls, cx, cy, w, h normalised on the input) rows, and each image's ratio_pad
        ((gain, gain), (pad_w, pad_h)) and original (h0, w0)."""
        z, off = self.z, self.off
        g0, g1 = off[start, 0], off[stop, 0]
        img = np.repeat(np.arange(stop - start), np.diff(off[start:stop + 1, 0]))
        fits = [_letterbox(*self.shapes[i]) for i in range(start, stop)]
        gain = np.array([f[0] for f in fits])[img, None]
        pad = np.array([(f[1], f[2]) * 2 for f in fits]).reshape(-1, 4)[img]
        xyxy = z["gt_xyxy"][g0:g1] * gain + pad
        xywhn = np.concatenate(((xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]), 1) / IMGSZ
        rows = np.concatenate((img[:, None], z["gt_cls"][g0:g1, None], xywhn), 1).astype(np.float32)
        ratio_pad = [((f[0], f[0]), (f[1], f[2])) for f in fits]
        return rows, ratio_pad, [tuple(int(v) for v in self.shapes[i]) for i in range(start, stop)]

    def coco_labels(self, path):
        """The labels as a COCO annotation file (category id = class index, image id = index), for pycocotools."""
        z = self.z
        img = np.repeat(np.arange(self.n), np.diff(self.off[:, 0]))
        xyxy = z["gt_xyxy"].astype(np.float64)
        anns = [{"id": k + 1, "image_id": int(i), "category_id": int(c), "iscrowd": 0,
                 "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)}
                for k, (i, c, (x1, y1, x2, y2)) in enumerate(zip(img.tolist(), z["gt_cls"].tolist(), xyxy.tolist()))]
        images = [{"id": i, "height": int(h), "width": int(w)} for i, (h, w) in enumerate(self.shapes)]
        cats = [{"id": c, "name": str(c)} for c in range(NC)]
        Path(path).write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))


def image_file(i):
    return f"images/val/{i:012d}.jpg"  # a numeric stem: both tools write the image id int(stem)


class Clock:
    """Wall and CPU seconds summed per stage."""

    def __init__(self):
        self.totals = {s: [0.0, 0.0] for s in STAGES}

    def __call__(self, stage, fn, *args):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.totals[stage][0] += time.perf_counter() - w
        self.totals[stage][1] += time.process_time() - c
        return out


def _rows_summary(rows):
    """(count, float64 sum) of every NMS row of every image: what both sides' NMS must agree on."""
    return sum(len(r) for r in rows), float(sum(r.double().sum() for r in rows))


def _fake_images(torch, n):
    """A batch's image tensor as the validators read it (its shape only), holding no pixels."""
    return torch.zeros((1, 1, 1, 1), dtype=torch.uint8).expand(n, 3, IMGSZ, IMGSZ)


def run_ours(data, work, coco_gt, stats_path):
    """Our stages: engine/tasks/boxes.BoxValidator as the detect task binds it, its own methods."""
    import types

    import torch

    from data.targets import Targets
    from engine.options import ValOptions
    from engine.tasks import TASKS
    from evaluation.fields import Letterbox, Predictions
    from utils.ops import OutputLayout

    names = {i: str(i) for i in range(NC)}
    v = TASKS["detect"].validator(ValOptions(imgsz=IMGSZ, conf=CONF, iou=IOU, max_det=MAX_DET), work, names)
    v.init_metrics(types.SimpleNamespace(output_layout=OutputLayout(NC, channels_last=False)))
    clock, records, jdict, summary = Clock(), [], [], [0, 0.0]
    for b, (start, stop) in enumerate(data.batches()):
        out = torch.from_numpy(data.output(start, stop))
        rows, ratio_pad, shapes = data.labels(start, stop)
        batch = {"img": _fake_images(torch, stop - start), "targets": Targets.from_rows(torch.from_numpy(rows),
                 (IMGSZ, IMGSZ)), "shapes": [(s, r) for s, r in zip(shapes, ratio_pad)],
                 "paths": [image_file(i) for i in range(start, stop)]}
        preds = clock("nms", v.postprocess, out, batch)
        n, s = _rows_summary([p.boxes for p in preds])
        summary = [summary[0] + n, summary[1] + s]
        records.append((b, clock("match", v.update_metrics, preds, batch)))
        jdict += clock("json", _ours_json, v, preds, batch, Letterbox, Predictions)
    stats = clock("map", lambda: v.get_stats(v._gather(records)))
    _save_stats(stats_path, *(torch.cat(v.records[k]).numpy() for k in ("tp", "conf", "pred_cls", "target_cls")))
    v.jdict = jdict
    pred_json = clock("json", v.write_predictions)
    result = {"rows": summary, "map": stats["metrics/mAP50-95(B)"], "map50": stats["metrics/mAP50(B)"]}
    if coco_gt:
        from evaluation.coco import eval_coco_json

        result["coco"] = clock("coco", eval_coco_json, coco_gt, pred_json)[0]
    return clock.totals, result


def _ours_json(v, preds, batch, Letterbox, Predictions):
    """A batch's COCO rows as BoxValidator.match_image writes them: each image's rows in original pixels, then
    pred_to_json."""
    rows = []
    for si, image in enumerate(preds):
        image = Predictions.of(image)
        if not len(image.boxes):
            continue
        fit = Letterbox.of_batch(batch, si)
        native = image.boxes.cpu().clone()
        for f in v.fields:
            f.scale(native, fit)
        rows += v.pred_to_json(image, native, batch, si)
    return rows


def _ultralytics_validator(work, names):
    """Ultralytics' DetectionValidator set as its init_metrics sets it for a dataset that is not COCO (the class
    index as the category id here, as ours writes it, so one annotation file serves both)."""
    import torch
    from ultralytics.models.yolo.detect import DetectionValidator
    from ultralytics.utils.metrics import ConfusionMatrix

    v = DetectionValidator(save_dir=Path(work), args={"conf": CONF, "iou": IOU, "max_det": MAX_DET, "plots": True,
                                                      "save_json": False, "task": "detect"})
    v.device, v.names, v.nc, v.class_map, v.training = torch.device("cpu"), names, NC, list(range(NC)), False
    v.seen, v.jdict, v.is_custom_json, v.build_gdict, v.end2end, v.pred_counts = 0, [], False, False, False, []
    v.metrics.names = names
    v.metrics.clear_stats()
    v.metrics.clear_image_metrics()
    v.confusion_matrix = ConfusionMatrix(names=names, save_matches=False)
    return v


def run_ultralytics(data, work, coco_gt, stats_path):
    """Ultralytics 8.4's stages: its DetectionValidator's own methods."""
    import torch

    v = _ultralytics_validator(work, {i: str(i) for i in range(NC)})
    clock, summary = Clock(), [0, 0.0]
    for start, stop in data.batches():
        out = torch.from_numpy(data.output(start, stop))
        rows, ratio_pad, shapes = data.labels(start, stop)
        rows = torch.from_numpy(rows)
        batch = {"img": _fake_images(torch, stop - start), "batch_idx": rows[:, 0], "cls": rows[:, 1:2],
                 "bboxes": rows[:, 2:6], "ori_shape": shapes, "ratio_pad": ratio_pad,
                 "im_file": [image_file(i) for i in range(start, stop)]}
        preds = clock("nms", v.postprocess, out)
        n, s = _rows_summary([torch.cat((p["bboxes"], p["conf"][:, None], p["cls"][:, None]), 1) for p in preds])
        summary = [summary[0] + n, summary[1] + s]
        clock("match", v.update_metrics, preds, batch)
        clock("json", _ultralytics_json, v, preds, batch)
    kept = clock("map", v.metrics.process, Path(work), False)
    _save_stats(stats_path, *(kept[k] for k in ("tp", "conf", "pred_cls", "target_cls")))
    stats = v.metrics.results_dict
    pred_json = Path(work) / "predictions.json"
    clock("json", _dump, v.jdict, pred_json)
    result = {"rows": summary, "map": stats["metrics/mAP50-95(B)"], "map50": stats["metrics/mAP50(B)"]}
    if coco_gt:
        result["coco"] = clock("coco", _pycocotools, coco_gt, pred_json)
    return clock.totals, result


def _ultralytics_json(v, preds, batch):
    """A batch's COCO rows as its update_metrics writes them under save_json: scale_preds, then pred_to_json."""
    for si, predn in enumerate(preds):
        if not len(predn["cls"]):
            continue
        pbatch = {"imgsz": batch["img"].shape[2:], "ori_shape": batch["ori_shape"][si],
                  "ratio_pad": batch["ratio_pad"][si], "im_file": batch["im_file"][si]}
        v.pred_to_json(v.scale_preds(predn, pbatch), pbatch)


def _save_stats(path, tp, conf, pred_cls, target_cls):
    """The matched statistics a side's mAP came from, for the driver to compare (`agreement`)."""
    np.savez(path, tp=tp, conf=conf, pred_cls=pred_cls, target_cls=target_cls)


def _dump(jdict, path):
    with open(path, "w", encoding="utf-8") as f:  # as its validator's __call__ writes predictions.json
        json.dump(jdict, f)


def _pycocotools(anno, pred):
    """mAP50-95 of `pred` against `anno` with pycocotools' COCOeval, as Ultralytics' coco_evaluate calls it."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(anno))
        e = COCOeval(gt, gt.loadRes(str(pred)), "bbox")
        e.evaluate()
        e.accumulate()
        e.summarize()
    return float(e.stats[0])


# ---------------------------------------------------------------- the driver
def child(side, npz, coco_gt, stats_path):
    import resource

    data = Data(npz)
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        totals, result = (run_ours if side == "ours" else run_ultralytics)(data, work, coco_gt or None, stats_path)
    result.update(stages=totals, n=data.n, total_s=time.perf_counter() - t0,
                  peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
    return result


def run_child(side, npz, coco_gt):
    stats = Path(npz).with_name(f"{Path(npz).stem}_{side}_stats.npz")
    return run_side("benchmarks.scale_val", side, npz, coco_gt or "", stats)


def bench(n, repeats, sides, coco, scratch):
    npz = Path(scratch) / f"val{n}.npz"
    if not npz.exists():
        make(n, npz)
    coco_gt = None
    if coco:
        coco_gt = Path(scratch) / f"val{n}_labels.json"
        Data(npz).coco_labels(coco_gt)
    runs = {s: [] for s in sides}
    for r in range(repeats):
        for s in sides if r % 2 == 0 else sides[::-1]:  # alternated, each side first in turn
            runs[s].append(run_child(s, npz, coco_gt))
    med = report(n, runs)
    if len(sides) == 2:
        agreement(npz, runs)
    return med


def report(n, runs):
    """Print each stage's median seconds and ms per image per side, and what each side's answer was; returns the
    medians {side: {stage: (wall, cpu)}}."""
    med = {}
    for s, rs in runs.items():
        med[s] = {k: tuple(statistics.median(r["stages"][k][i] for r in rs) for i in (0, 1)) for k in STAGES}
        r = rs[0]
        coco = f", pycocotools {r['coco']:.5f}" if "coco" in r else ""
        print(f"{s:<12} {n} images: {r['rows'][0]} NMS rows ({r['rows'][0] / n:.1f} an image, sum {r['rows'][1]:.6e}),"
              f" mAP50-95 {r['map']:.6f}, mAP50 {r['map50']:.6f}{coco}; peak RSS {max(x['peak_mb'] for x in rs)} MB")
    for k in (k for k in STAGES if any(m[k][0] for m in med.values())):  # pycocotools only with --coco
        cells = [f"{s} {w:7.3f} s ({w / n * 1e3:.4f} ms/img, CPU {c:7.3f} s)" for s, (w, c) in
                 ((s, med[s][k]) for s in med)]
        ratio = ""
        if len(med) == 2 and min(m[k][0] for m in med.values()) > 0:
            a, b = (m[k][0] for m in med.values())
            ratio = f"  ours/theirs {a / b:.2f}x"
        print(f"  {k:<6} " + " | ".join(cells) + ratio)
    return med


def ap_to_last_recall(tp, conf, pred_cls, target_cls, eps=1e-16):
    """mAP50-95 with Ultralytics 8.4's AP rule (its compute_ap: the precision envelope falls to 0 at the last recall
    reached, sentinels (r_last, 0) and (1, 0)), where ours keeps the YOLOv5 rule (evaluation/metrics.py: the last
    precision held to recall 1); both integrate 101 points with the trapezoid rule."""
    order = np.argsort(-conf, kind="stable")
    tp, pred_cls = tp[order].astype(float), pred_cls[order]
    classes, n_labels = np.unique(target_cls, return_counts=True)
    x = np.linspace(0, 1, 101)
    ap = np.zeros((len(classes), tp.shape[1]))
    for ci, c in enumerate(classes):
        t = tp[pred_cls == c]
        if not len(t):
            continue
        tpc, fpc = t.cumsum(0), (1 - t).cumsum(0)
        recall, precision = tpc / (n_labels[ci] + eps), tpc / (tpc + fpc)
        for j in range(t.shape[1]):
            mrec = np.concatenate(([0.0], recall[:, j], [recall[-1, j], 1.0]))
            mpre = np.flip(np.maximum.accumulate(np.flip(np.concatenate(([1.0], precision[:, j], [0.0, 0.0])))))
            y = np.interp(x, mrec, mpre)
            ap[ci, j] = float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum())
    return float(ap.mean()) if len(ap) else 0.0


def agreement(npz, runs):
    """Whether the two sides did the same work: the same NMS rows, the same matches of each row, and the same
    mAP50-95 once the one rule that differs (how AP ends past the last recall) is the same."""
    ours, theirs = (np.load(Path(npz).with_name(f"{Path(npz).stem}_{s}_stats.npz")) for s in SIDES)
    same_rows = ours["conf"].shape == theirs["conf"].shape and np.array_equal(ours["conf"], theirs["conf"])
    tp_same = float((ours["tp"] == theirs["tp"]).all(1).mean()) if same_rows else float("nan")
    a, b = (rs[0] for rs in runs.values())
    last = ap_to_last_recall(*(ours[k] for k in ("tp", "conf", "pred_cls", "target_cls")))
    print(f"  agreement: NMS rows {a['rows'][0]} vs {b['rows'][0]} (sums {a['rows'][1]:.9e} vs {b['rows'][1]:.9e}), "
          f"same confidences {same_rows}, rows matched alike at all 10 thresholds {tp_same:.6f}; mAP50-95 ours "
          f"{a['map']:.6f}, theirs {b['map']:.6f}; ours' matches under their AP rule {last:.6f} "
          f"(differs from theirs by {abs(last - b['map']):.1e})")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        print(json.dumps(child(*sys.argv[2:6])))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, nargs="+", default=[5000])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--coco", action="store_true", help="also time pycocotools' evaluation of each side's JSON")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=None)
    p.add_argument("--scratch", default=None, help="folder for the data (default: a temporary one, removed after)")
    opt = p.parse_args()
    sides = opt.sides or (SIDES if (PEERS / "bin" / "python").exists() else SIDES[:1])
    with tempfile.TemporaryDirectory() as tmp:
        for n in opt.images:
            bench(n, opt.repeats, sides, opt.coco, opt.scratch or tmp)


if __name__ == "__main__":
    main()
