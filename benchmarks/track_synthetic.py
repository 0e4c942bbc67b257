"""Score the trackers on the synthetic video (data/synthetic_video.py): ours, and Ultralytics' fed the very
same detections and frames, each writing a MOT text file; `score` gives MOTA, IDF1, id switches and
fragments from motmetrics (IoU >= 0.5 a match) and HOTA, DetA and AssA from TrackEval (`pip install trackeval`:
the boxes' IoU its similarity, averaged over its 19 thresholds 0.05..0.95) for every file given.

    python -m benchmarks.track_synthetic run --tracker bytetrack --out /tmp/ours-byte.txt
    source /tmp/peers-venv/peer-env.sh    # from the clone's root, so -m finds the project's packages
    /tmp/peers-venv/bin/python -m benchmarks.track_synthetic run --peer --tracker bytetrack --out /tmp/ul-byte.txt
    python -m benchmarks.track_synthetic score /tmp/ours-byte.txt /tmp/ul-byte.txt

`--seeds 0 1 2` runs (and scores) several videos, one file per seed (`--out x.txt` -> x.0.txt ...).
"""

import argparse
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from data.synthetic_video import detections, render_video

VIDEO = {"n_frames": 150, "size": (240, 320), "n_objects": 6}


class _Dets:
    """The detections in the form Ultralytics' trackers read (`conf`, `xyxy`, `xywh`, `cls`, indexable)."""

    def __init__(self, d):
        self.d = d
        self.conf, self.xyxy, self.cls = d[:, 4], d[:, :4], d[:, 5]
        wh = d[:, 2:4] - d[:, :2]
        self.xywh = np.c_[d[:, :2] + wh / 2, wh]

    def __len__(self):
        return len(self.d)

    def __getitem__(self, i):
        return _Dets(self.d[i])


def _peer_tracker(name):
    import ultralytics
    from ultralytics.trackers.bot_sort import BOTSORT
    from ultralytics.trackers.byte_tracker import BYTETracker
    from ultralytics.utils import YAML

    cfg = YAML.load(Path(ultralytics.__file__).parent / "cfg" / "trackers" / f"{name}.yaml")
    return (BOTSORT if name == "botsort" else BYTETracker)(SimpleNamespace(**cfg))


def run(tracker, peer, seed):
    """MOT lines of one video."""
    frames, truth = render_video(seed, **VIDEO)
    dets = detections(truth, seed, size=VIDEO["size"])
    lines = []
    if peer:
        t = _peer_tracker(tracker)
        for f, (im, d) in enumerate(zip(frames, dets), 1):
            out = t.update(_Dets(d), im)  # x1, y1, x2, y2, id, score, cls, index
            lines += [f"{f},{int(r[4])},{r[0]:.2f},{r[1]:.2f},{r[2] - r[0]:.2f},{r[3] - r[1]:.2f},{r[5]:.4f},-1,-1,-1\n"
                      for r in out]
        return lines
    from engine.tracking.config import load_tracker_config, make_tracker
    from engine.tracking.mot import mot_lines

    t = make_tracker(load_tracker_config(tracker))
    for f, (im, d) in enumerate(zip(frames, dets), 1):
        idx, ids, boxes = t.update(d[:, :4], d[:, 4], d[:, 5], im)
        lines += mot_lines(f, boxes, ids, d[idx, 4])  # the tracks' boxes, as --track reports them
    return lines


def score(files, seeds):
    """{file: motmetrics summary row, with HOTA, DetA and AssA} over the seeds' videos."""
    from engine.tracking.mot import read_mot

    runs = {}
    for f in files:
        for seed in seeds:
            _, truth = render_video(seed, **VIDEO)
            hyp = read_mot(_seeded(f, seed, seeds))
            runs[f"{f}@{seed}"] = [(t[:, 0], hyp[i][:, 0], _iou(t[:, 2:6], hyp[i][:, 1:5]))
                                   for i, t in enumerate(truth, 1)]
    return summary(runs)


def summary(runs):
    """A table of `runs` ({name: per frame (truth ids, hypothesis ids, IoU truth x hypothesis)}): motmetrics'
    MOTA, IDF1, switches, fragments (a match at IoU >= 0.5) and TrackEval's HOTA, DetA, AssA."""
    import motmetrics as mm

    accs = []
    for frames in runs.values():
        acc = mm.MOTAccumulator(auto_id=True)
        for gt, hyp, iou in frames:
            acc.update(gt.astype(int).tolist(), hyp.astype(int).tolist(), np.where(iou >= 0.5, 1 - iou, np.nan))
        accs.append(acc)
    metrics = ["mota", "idf1", "num_switches", "num_fragmentations", "mostly_tracked", "num_false_positives",
               "num_misses"]
    table = mm.metrics.create().compute_many(accs, metrics=metrics, names=list(runs), generate_overall=False)
    if importlib.util.find_spec("trackeval") is None:  # not in the [dev] extra: main() says it is left out
        return table
    scores = [hota(frames) for frames in runs.values()]
    for key in ("HOTA", "DetA", "AssA"):
        table[key.lower()] = [s[key] for s in scores]
    return table


def hota(frames):
    """{HOTA, DetA, AssA} of one sequence by TrackEval's HOTA (each the mean over its 19 IoU thresholds), `frames`
    as in `summary`. TrackEval's own readers take files laid out as a benchmark's; its metric takes the sequence
    as arrays, ids numbered from 0."""
    from trackeval.metrics import HOTA

    gt_index, hyp_index = {}, {}
    gt_ids = [np.array([gt_index.setdefault(int(i), len(gt_index)) for i in gt], dtype=int) for gt, _, _ in frames]
    hyp_ids = [np.array([hyp_index.setdefault(int(i), len(hyp_index)) for i in h], dtype=int) for _, h, _ in frames]
    data = {"num_timesteps": len(frames), "gt_ids": gt_ids, "tracker_ids": hyp_ids,
            "similarity_scores": [np.asarray(iou, dtype=float).reshape(len(g), len(h))
                                  for g, h, iou in zip(gt_ids, hyp_ids, (f[2] for f in frames))],
            "num_gt_dets": sum(map(len, gt_ids)), "num_tracker_dets": sum(map(len, hyp_ids)),
            "num_gt_ids": len(gt_index), "num_tracker_ids": len(hyp_index)}
    res = HOTA().eval_sequence(data)
    return {key: float(np.mean(res[key])) for key in ("HOTA", "DetA", "AssA")}


def _iou(a, b):
    """IoU of xyxy boxes, truth x hypothesis: motmetrics' own iou_matrix needs numpy < 2."""
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    union = (a[:, 2:] - a[:, :2]).prod(-1)[:, None] + (b[:, 2:] - b[:, :2]).prod(-1)[None] - inter
    return inter / np.maximum(union, 1e-9)


def _seeded(f, seed, seeds):
    return f if len(seeds) == 1 else str(Path(f).with_suffix(f".{seed}.txt"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["run", "score"])
    p.add_argument("files", nargs="*")
    p.add_argument("--tracker", default="bytetrack", choices=["bytetrack", "botsort"])
    p.add_argument("--peer", action="store_true", help="run Ultralytics' tracker (in the peers' venv)")
    p.add_argument("--out", default="track.txt")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = p.parse_args()
    if a.mode == "run":
        for seed in a.seeds:
            Path(_seeded(a.out, seed, a.seeds)).write_text("".join(run(a.tracker, a.peer, seed)))
        return
    table = score(a.files, a.seeds)
    print(table.to_string())
    if "hota" not in table:
        print("HOTA left out: pip install trackeval (or pip install -e '.[hota]')")


if __name__ == "__main__":
    main()
