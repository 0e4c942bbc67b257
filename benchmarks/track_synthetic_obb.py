"""Score the trackers on oriented boxes: the synthetic video's turning rectangles (data/synthetic_video.py, `spin`),
ours and Ultralytics' fed the same detections and frames, each writing its tracked rows (frame, id, xywhr, conf) to
a .npy file; `score` gives MOTA, IDF1, id switches and fragments from motmetrics, matching by polygon IoU >= 0.5,
and TrackEval's HOTA, DetA and AssA with the same polygon IoU as its similarity (benchmarks/track_synthetic.py).

    python -m benchmarks.track_synthetic_obb run --tracker bytetrack --out /tmp/ours-obb.npy
    source /tmp/peers-venv/peer-env.sh    # from the clone's root, so -m finds the project's packages
    /tmp/peers-venv/bin/python -m benchmarks.track_synthetic_obb run --peer --tracker bytetrack --out /tmp/ul-obb.npy
    python -m benchmarks.track_synthetic_obb score /tmp/ours-obb.npy /tmp/ul-obb.npy

The detections come as each tool's predict reports them: ours regularised (angle in [0, pi/2), sides swapped where
that turned the box), Ultralytics 8.4's in the head's range (w >= h, angle in [-pi/4, 3pi/4)); `--form` gives both
the one form instead.
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.track_synthetic import _peer_tracker, summary
from data.synthetic_video import detections, render_video
from utils.rotated import canonical, polygon_iou, xywhr_to_corners

VIDEO = {"n_frames": 150, "size": (240, 320), "n_objects": 6, "spin": 0.06}


class _OBBDets:
    """Oriented detections as Ultralytics' trackers read an OBB result (`conf`, `xywhr`, `cls`, and `xyxy` the
    envelopes, which BoT-SORT's motion compensation masks; indexable)."""

    def __init__(self, d):
        self.d, self.conf, self.cls = d, d[:, 4], d[:, 5]
        self.xywhr = np.c_[d[:, :4], d[:, 6]]
        corners = xywhr_to_corners(torch.from_numpy(self.xywhr)).numpy()
        self.xyxy = np.c_[corners.min(1), corners.max(1)]

    def __len__(self):
        return len(self.d)

    def __getitem__(self, i):
        return _OBBDets(self.d[i])


def _in_form(d, form):
    """Rows (x, y, w, h, conf, cls, r) with the box in `form`: 'regularized' (as made) or 'canonical'."""
    if form == "regularized" or not len(d):
        return d
    c = canonical(torch.from_numpy(np.c_[d[:, :4], d[:, 6]])).numpy()
    return np.c_[c[:, :4], d[:, 4:6], c[:, 4]]


def run(tracker, peer, seed, form):
    """(n, 8) rows of one video: frame, id, x, y, w, h, r, conf."""
    frames, truth = render_video(seed, **VIDEO)
    dets = [_in_form(d, form or ("canonical" if peer else "regularized"))
            for d in detections(truth, seed, size=VIDEO["size"])]
    rows = []
    if peer:
        t = _peer_tracker(tracker)
        for f, (im, d) in enumerate(zip(frames, dets), 1):
            out = t.update(_OBBDets(d), im)  # x, y, w, h, angle, id, score, cls, index
            rows += [[f, r[5], *r[:5], r[6]] for r in out]
    else:
        from engine.tracking.config import load_tracker_config, make_tracker

        t = make_tracker(load_tracker_config(tracker), rotated=True)
        for f, (im, d) in enumerate(zip(frames, dets), 1):
            idx, ids, boxes = t.update(np.c_[d[:, :4], d[:, 6]], d[:, 4], d[:, 5], im)
            rows += [[f, i, *b, d[j, 4]] for j, i, b in zip(idx, ids, boxes)]  # the tracks' boxes, as --track's
    return np.array(rows, dtype=np.float64).reshape(-1, 8)


def score(files, seeds):
    """{file: motmetrics summary row, with HOTA, DetA and AssA} over the seeds' videos."""
    runs = {}
    for f in files:
        for seed in seeds:
            _, truth = render_video(seed, **VIDEO)
            hyp = np.load(_seeded(f, seed, seeds))
            frames = []
            for i, t in enumerate(truth, 1):
                h = hyp[hyp[:, 0] == i]
                iou = polygon_iou(xywhr_to_corners(torch.from_numpy(t[:, 2:7])),
                                  xywhr_to_corners(torch.from_numpy(h[:, 2:7]))).numpy()
                frames.append((t[:, 0], h[:, 1], iou))
            runs[f"{f}@{seed}"] = frames
    return summary(runs)


def _seeded(f, seed, seeds):
    return f if len(seeds) == 1 else str(Path(f).with_suffix(f".{seed}.npy"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["run", "score"])
    p.add_argument("files", nargs="*")
    p.add_argument("--tracker", default="bytetrack", choices=["bytetrack", "botsort"])
    p.add_argument("--peer", action="store_true", help="run Ultralytics' tracker (in the peers' venv)")
    p.add_argument("--form", choices=["regularized", "canonical"], help="both tools given this form")
    p.add_argument("--out", default="track-obb.npy")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = p.parse_args()
    if a.mode == "run":
        for seed in a.seeds:
            np.save(_seeded(a.out, seed, a.seeds), run(a.tracker, a.peer, seed, a.form))
    else:
        table = score(a.files, a.seeds)
        print(table.to_string())
        if "hota" not in table:
            print("HOTA left out: pip install trackeval (or pip install -e '.[hota]')")


if __name__ == "__main__":
    main()
