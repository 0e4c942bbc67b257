"""ByteTrack and BoT-SORT (without re-identification): ids for a stream of per-frame detections.

`update(boxes, scores, classes, frame=None)` takes one frame's detections (xyxy, in the frame's pixels) and returns,
for each detection that a confirmed track holds this frame, its index, the track's id and the track's box: where the
Kalman filter puts it after this frame's update (`Track.box`), as Ultralytics' trackers report it, which smooths the
detections' jitter (a track confirmed on its first frame: the detection's box, which the filter starts from). The
detection's score, class (and a caller's masks or keypoints) go with it by its index. ByteTrack's idea is the
second association: detections below `track_high_thresh` (but above `track_low_thresh`) are not thrown away but
matched to the tracks the confident ones left, which keeps an id through a partial occlusion where the detector's
score drops. BoT-SORT adds a Kalman filter over (cx, cy, w, h) and global motion compensation (engine/tracking/gmc.py).

A track is born tentative from a confident unmatched detection (>= `new_track_thresh`), confirmed by a match on the
next frame (on the first frame at once), lost when unmatched, and forgotten `track_buffer` frames (at 30 fps) after
it was last seen; a lost track matched again gets its id back.

Oriented boxes (an OBB model's, `rotated=True`: xywhr rows, as Ultralytics' trackers carry them) are followed the same
way: the filter over the centre and the box's own sides (a track born long side first, `_long_side_first`), the
angle the last matched detection's (written in the track's turn and side order, `matching.same_turn`), and boxes
compared by their probabilistic IoU (`matching.probiou_matrix`), as Ultralytics' trackers compare them.
"""

import numpy as np

from engine.tracking.gmc import SparseFlowGMC
from engine.tracking.kalman import KalmanXYAH, KalmanXYWH, to_xyxy, xyxy_to
from engine.tracking.matching import assign, box_iou, iou_cost, probiou_matrix, same_turn

TENTATIVE, TRACKED, LOST = "tentative", "tracked", "lost"


def _measured(box, form):
    """The filter's measurement of a box: xyxy, or an oriented box's centre and sides (xywhr, the angle aside)."""
    if len(box) == 5:
        box = np.r_[box[:2] - box[2:4] / 2, box[:2] + box[2:4] / 2]
    return xyxy_to(box, form)[0]


def _long_side_first(box):
    """An oriented box (xywhr) as the same rectangle with w >= h, the angle in [-pi/4, 3pi/4): the form a track is
    born in, so its filter's h is the short side whatever form the detector reports, as in Ultralytics' trackers
    (their detections come so), whose filter's noise scales with h."""
    if len(box) == 4:
        return box
    x, y, w, h, r = box
    if w < h:
        w, h, r = h, w, r + np.pi / 2
    return np.array([x, y, w, h, (r + np.pi / 4) % np.pi - np.pi / 4])


class Track:
    def __init__(self, kf, form, box, score, cls, frame):
        self.kf, self.form = kf, form
        box = _long_side_first(box)
        self.angle = box[4] if len(box) == 5 else None  # an oriented box's, from the last detection matched
        self.mean, self.cov = kf.initiate(_measured(box, form))
        self.score, self.cls, self.id = score, cls, None
        self.state, self.start, self.last_seen = TENTATIVE, frame, frame

    @property
    def box(self):
        """Where the filter puts the box: xyxy, or xywhr for an oriented one."""
        b = to_xyxy(self.mean[:4], self.form)[0]
        return b if self.angle is None else np.r_[(b[:2] + b[2:]) / 2, b[2:] - b[:2], self.angle]

    def update(self, box, score, cls, frame):
        if self.angle is not None:
            box = same_turn(box, self.box)
            self.angle = box[4]
        self.mean, self.cov = self.kf.update(self.mean, self.cov, _measured(box, self.form))
        self.score, self.cls, self.last_seen, self.state = score, cls, frame, TRACKED


class ByteTracker:
    """`cfg`: a engine/tracking/config.TrackerConfig; `frame_rate` scales how long a lost track is kept; `rotated`:
    the boxes are oriented (xywhr)."""

    kalman, form = KalmanXYAH, "xyah"
    still = (7,)  # the size velocities a track not seen last frame loses (else the filter would shrink it away)

    def __init__(self, cfg, frame_rate=30, rotated=False):
        self.cfg, self.kf = cfg, self.kalman()
        self.width, self.iou = (5, probiou_matrix) if rotated else (4, box_iou)
        self.max_lost = max(1, int(frame_rate / 30 * cfg.track_buffer))
        self.tracks, self.frame, self.next_id = [], 0, 1

    def reset(self):
        self.tracks, self.frame, self.next_id = [], 0, 1

    def _predict(self, tracks):
        if not tracks:
            return
        mean = np.stack([t.mean for t in tracks])
        for m, t in zip(mean, tracks):
            if t.state != TRACKED:
                m[list(self.still)] = 0
        mean, cov = self.kf.predict(mean, np.stack([t.cov for t in tracks]))
        for t, m, c in zip(tracks, mean, cov):
            t.mean, t.cov = m, c

    def compensate(self, tracks, frame):
        """Hook: camera motion (BoT-SORT)."""

    def _match(self, tracks, boxes, scores, idx, thresh, fuse):
        """Pair `tracks` with detections `idx`: (matched (track, detection index) pairs, tracks left, indices left)."""
        cost = iou_cost(np.array([t.box for t in tracks]).reshape(-1, self.width), boxes[idx],
                        scores[idx] if fuse else None, self.iou)
        pairs, rest_t, rest_d = assign(cost, thresh)
        return [(tracks[i], idx[j]) for i, j in pairs], [tracks[i] for i in rest_t], [idx[j] for j in rest_d]

    def update(self, boxes, scores, classes, frame=None):
        """One frame: `boxes` (n, 4) xyxy (oriented: (n, 5) xywhr), `scores` (n,), `classes` (n,); `frame` the image
        (BoT-SORT's motion compensation reads it). Returns (detection indices, track ids, track boxes): int arrays of
        the detections a confirmed track holds this frame, and its tracks' boxes, (k, 4) xyxy (oriented: (k, 5)
        xywhr, in the track's turn)."""
        cfg = self.cfg
        self.frame += 1
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, self.width)
        scores, classes = np.asarray(scores, dtype=np.float64).reshape(-1), np.asarray(classes).reshape(-1)
        # a box of no width or height (one clipped wholly off the image) has no aspect ratio and no noise scale for
        # the filter: it is left out, as Ultralytics leaves it (a 40 x 0 box came back a point, and took an id)
        sized = (boxes[:, 2] > 0) & (boxes[:, 3] > 0) if self.width == 5 else \
            (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        high = np.flatnonzero(sized & (scores >= cfg.track_high_thresh))
        low = np.flatnonzero(sized & (scores > cfg.track_low_thresh) & (scores < cfg.track_high_thresh))
        confirmed = [t for t in self.tracks if t.state in (TRACKED, LOST)]
        tentative = [t for t in self.tracks if t.state == TENTATIVE]
        self._predict(confirmed)  # a tentative track is updated from where it was born, as in Ultralytics
        self.compensate(self.tracks, frame)
        held = []  # (track, detection index)
        pairs, rest, left = self._match(confirmed, boxes, scores, high, cfg.match_thresh, cfg.fuse_score)
        held += pairs
        pairs, rest, _ = self._match([t for t in rest if t.state == TRACKED], boxes, scores, low, 0.5, False)
        held += pairs
        for t in rest:
            t.state = LOST
        pairs, unmatched, left = self._match(tentative, boxes, scores, np.array(left, int), 0.7, cfg.fuse_score)
        held += pairs
        dropped = set(map(id, unmatched))  # a tentative track unmatched on its second frame was noise
        for t, j in held:
            t.update(boxes[j], scores[j], classes[j], self.frame)
            if t.id is None:
                t.id, self.next_id = self.next_id, self.next_id + 1
        for j in left:
            if scores[j] >= cfg.new_track_thresh:
                t = Track(self.kf, self.form, boxes[j], scores[j], classes[j], self.frame)
                if self.frame == 1:  # the first frame's tracks are confirmed at once
                    t.state, t.id, self.next_id = TRACKED, self.next_id, self.next_id + 1
                    held.append((t, j))
                self.tracks.append(t)
        self.tracks = [t for t in self.tracks if id(t) not in dropped and self.frame - t.last_seen <= self.max_lost]
        self._drop_duplicates()
        held = [(t, j) for t, j in held if t in self.tracks]
        return (np.array([j for _, j in held], int), np.array([t.id for t, _ in held], int),
                np.array([t.box for t, _ in held], np.float64).reshape(-1, self.width))

    def _drop_duplicates(self):
        """A lost track that sits on a tracked or tentative one (IoU > 0.85) is the same object: the one followed for
        fewer frames (first to last seen) goes, the tracked one on a tie, as in ByteTrack and Ultralytics. The lost
        track's span ends where it was last seen: measured to this frame, a track lost after 4 frames outweighed
        the one following the object for 12, which went, and the lost one took the object's next frame (an id
        switch)."""
        tracked = [t for t in self.tracks if t.state != LOST]
        lost = [t for t in self.tracks if t.state == LOST]
        if not tracked or not lost:
            return
        iou = self.iou(np.array([t.box for t in tracked]), np.array([t.box for t in lost]))
        gone = set()
        for i, j in zip(*np.nonzero(iou > 0.85)):
            a, b = tracked[i], lost[j]
            gone.add(id(b) if a.last_seen - a.start > b.last_seen - b.start else id(a))
        self.tracks = [t for t in self.tracks if id(t) not in gone]


class BotSort(ByteTracker):
    """ByteTrack with a (cx, cy, w, h) filter and global motion compensation (`gmc_method: sparseOptFlow`)."""

    kalman, form = KalmanXYWH, "xywh"
    still = (6, 7)

    def __init__(self, cfg, frame_rate=30, rotated=False):
        super().__init__(cfg, frame_rate, rotated)
        self.gmc = SparseFlowGMC() if cfg.gmc_method == "sparseOptFlow" else None

    def reset(self):
        super().reset()
        self.gmc = SparseFlowGMC() if self.cfg.gmc_method == "sparseOptFlow" else None

    def compensate(self, tracks, frame):
        if self.gmc is None or frame is None:
            return
        A = self.gmc.apply(frame)
        if not tracks or np.allclose(A, np.eye(2, 3)):
            return
        R8 = np.kron(np.eye(4), A[:, :2])  # the rotation and scale on each (x, y) pair of the state
        # an oriented box's angle is left as it is, as Ultralytics leaves it: turned by the flow's rotation, which on
        # a still camera follows the moving shapes, the synthetic video's BoT-SORT IDF1 fell from 0.770 to 0.731
        for t in tracks:
            t.mean = R8 @ t.mean
            t.mean[:2] += A[:, 2]
            t.cov = R8 @ t.cov @ R8.T
