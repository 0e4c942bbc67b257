"""`ValMetrics`: what `YOLO.val()` and `YOLO.train()` return, as Ultralytics' users read it (`metrics.box.map`,
`metrics.seg.map50`, `metrics.pose.maps`, `metrics.top1`, `metrics.results_dict`, `metrics.speed`), over the
validator's own metrics (evaluation/metrics.DetMetrics' parts, ClassifyMetrics). It is also the results dict the val
scripts return (results.csv's names: `metrics/mAP50-95(B)`, ...), so code that read that dict keeps working."""

import numpy as np

MAP75 = 5  # the column of IoU 0.75 among the ten thresholds 0.50:0.05:0.95 (evaluation/metrics.IOU_THRESHOLDS)


class PartMetrics:
    """One part of a detection-family validation (boxes, masks or keypoints): means and per-class values."""

    def __init__(self, metric, nc):
        self._m, self._nc = metric, nc

    p = property(lambda self: self._m.p)  # per class evaluated (ap_class_index's order)
    r = property(lambda self: self._m.r)
    f1 = property(lambda self: self._m.f1)
    ap50 = property(lambda self: self._m.ap50)
    ap = property(lambda self: self._m.ap)
    all_ap = property(lambda self: self._m.all_ap)
    ap_class_index = property(lambda self: self._m.ap_class_index)
    mp = property(lambda self: self._m.mp)
    mr = property(lambda self: self._m.mr)
    map50 = property(lambda self: self._m.map50)
    map = property(lambda self: self._m.map)

    @property
    def map75(self):
        return float(self.all_ap[:, MAP75].mean()) if len(self.all_ap) else 0.0

    @property
    def maps(self):
        """AP50-95 per class id (nc,); a class without labels in the split gets the mean, as Ultralytics does."""
        return self._m.maps(self._nc)

    def mean_results(self):
        return [self.mp, self.mr, self.map50, self.map]

    def __repr__(self):
        return f"PartMetrics(mp={self.mp:.4g}, mr={self.mr:.4g}, map50={self.map50:.4g}, map={self.map:.4g})"


class ValMetrics(dict):
    """The results dict of a validation, with `box`, `seg`, `pose` (PartMetrics; None where the task has no such
    part), `top1`/`top5` (classifiers), `results_dict` (the dict itself, fitness included), `fitness`, `speed` (ms
    per image: preprocess, inference, loss, postprocess), `names` and `save_dir`. `validator`: the validator that
    produced `stats` (None: only the dict's values are known, and the parts are None)."""

    def __init__(self, stats, validator=None, save_dir=None):
        super().__init__(stats)
        metrics = getattr(validator, "metrics", None)
        self.names = dict(getattr(validator, "names", None) or {})
        self.speed = dict(getattr(validator, "speed", None) or {})
        self.save_dir = save_dir
        nc = len(self.names) or None
        for part in ("box", "seg", "pose"):
            m = getattr(metrics, part, None)
            setattr(self, part, PartMetrics(m, nc or len(m.ap)) if m is not None else None)
        self.top1 = getattr(metrics, "top1", None)
        self.top5 = getattr(metrics, "top5", None)

    @property
    def results_dict(self):
        return dict(self)

    @property
    def fitness(self):
        return self.get("fitness")

    @property
    def maps(self):
        """AP50-95 per class id, summed over the parts, as Ultralytics' `metrics.maps`."""
        parts = [p.maps for p in (self.box, self.seg, self.pose) if p is not None]
        return np.sum(parts, 0) if parts else None
