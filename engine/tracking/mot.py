"""What a tracked run leaves: the MOT Challenge text file (one line per tracked box and frame) and the id trails
drawn on the saved video."""

from collections import defaultdict, deque

import cv2
import numpy as np

TRAIL = 30  # frames of an id's path drawn behind it


def mot_lines(frame, boxes, ids, scores):
    """MOT Challenge rows of one frame (1-based): `frame,id,x,y,w,h,conf,-1,-1,-1`, box top-left and size in
    pixels."""
    lines = []
    for (x1, y1, x2, y2), i, s in zip(np.asarray(boxes).reshape(-1, 4), ids, scores):
        lines.append(f"{frame},{int(i)},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{float(s):.4f},-1,-1,-1\n")
    return lines


def read_mot(path):
    """{frame: (n, 5) array of id, x1, y1, x2, y2} from a MOT text file."""
    rows = np.loadtxt(path, delimiter=",", ndmin=2) if open(path).read().strip() else np.zeros((0, 10))
    out = defaultdict(lambda: np.zeros((0, 5)))
    for f in np.unique(rows[:, 0]).astype(int):
        r = rows[rows[:, 0] == f]
        out[f] = np.c_[r[:, 1], r[:, 2], r[:, 3], r[:, 2] + r[:, 4], r[:, 3] + r[:, 5]]
    return out


class Trails:
    """The last TRAIL centres of each id, drawn as a polyline in the id's colour. An id not drawn for TRAIL frames
    is forgotten (its trail starts afresh if it comes back): a long stream's ids would otherwise pile up."""

    def __init__(self):
        self.paths = defaultdict(lambda: deque(maxlen=TRAIL))
        self.seen, self.frame = {}, 0  # id -> the last frame (count of draws) it was drawn in

    def draw(self, im, boxes, ids):
        self.frame += 1
        for (x1, y1, x2, y2), i in zip(np.asarray(boxes).reshape(-1, 4), ids):
            path = self.paths[int(i)]
            self.seen[int(i)] = self.frame
            path.append((int((x1 + x2) / 2), int((y1 + y2) / 2)))
            if len(path) > 1:
                cv2.polylines(im, [np.array(path, np.int32)], False, id_colour(i), 2, cv2.LINE_AA)
        for i in [i for i, f in self.seen.items() if self.frame - f >= TRAIL]:
            del self.paths[i], self.seen[i]
        return im


def id_colour(i):
    """A BGR colour per id, the same in every run (golden-ratio hues)."""
    hue = int((int(i) * 0.618033988749895 % 1) * 179)
    return tuple(int(c) for c in cv2.cvtColor(np.uint8([[[hue, 220, 255]]]), cv2.COLOR_HSV2BGR)[0, 0])
