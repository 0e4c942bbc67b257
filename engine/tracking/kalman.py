"""Constant-velocity Kalman filters over a box, as SORT, ByteTrack and BoT-SORT use them.

The state is the box's four numbers and their velocities; the noise of each is proportional to the box's height
(`XYAH`: centre, aspect ratio w/h, height, as ByteTrack) or to its width and height (`XYWH`: centre, width, height, as
BoT-SORT, whose widths change independently of heights). The weights 1/20 (position) and 1/160 (velocity) of the
box's size are the ones both papers use.
"""

import numpy as np

POS_WEIGHT, VEL_WEIGHT = 1 / 20, 1 / 160


class KalmanXYAH:
    """Measurement (cx, cy, a, h): the noise of the centre and height scales with h; the aspect ratio's is a fixed
    small value (1e-2 as a position, 1e-5 as a velocity, 1e-1 when measured)."""

    ndim = 4
    fixed_aspect = (1e-2, 1e-5, 1e-1)

    def __init__(self):
        self.F = np.eye(2 * self.ndim)
        self.F[: self.ndim, self.ndim:] = np.eye(self.ndim)  # x' = x + v (one frame)
        self.H = np.eye(self.ndim, 2 * self.ndim)

    def _sizes(self, m):
        """The size each of the 4 values' noise scales with: (n, 4)."""
        h = m[..., 3]
        return np.stack([h, h, h, h], -1)

    def _std(self, m, pos, vel, which):
        """Standard deviations (pos: the 4 values, vel: their velocities); `which` picks the fixed aspect noise."""
        s = self._sizes(m)
        std = np.concatenate([pos * s, vel * s], -1)
        if self.fixed_aspect:
            std[..., 2] = self.fixed_aspect[0] if which != "measure" else self.fixed_aspect[2]
            std[..., 6] = self.fixed_aspect[1]
        return std

    def initiate(self, z):
        mean = np.r_[z, np.zeros(self.ndim)]
        return mean, np.diag(self._std(z, 2 * POS_WEIGHT, 10 * VEL_WEIGHT, "initiate") ** 2)

    def predict(self, mean, cov):
        """Many tracks at once: mean (n, 8), cov (n, 8, 8)."""
        q = self._std(mean[:, : self.ndim], POS_WEIGHT, VEL_WEIGHT, "predict") ** 2
        mean = mean @ self.F.T
        cov = self.F @ cov @ self.F.T + q[:, :, None] * np.eye(2 * self.ndim)
        return mean, cov

    def update(self, mean, cov, z):
        r = self._std(mean[: self.ndim], POS_WEIGHT, 0, "measure")[: self.ndim] ** 2
        S = self.H @ cov @ self.H.T + np.diag(r)
        K = np.linalg.solve(S, self.H @ cov).T  # cov H^T S^-1 (S and cov symmetric)
        mean = mean + K @ (z - self.H @ mean)
        cov = cov - K @ S @ K.T
        return mean, cov


class KalmanXYWH(KalmanXYAH):
    """Measurement (cx, cy, w, h): x and w scale with the width, y and h with the height."""

    fixed_aspect = None

    def _sizes(self, m):
        w, h = m[..., 2], m[..., 3]
        return np.stack([w, h, w, h], -1)


def xyxy_to(boxes, form):
    """(n, 4) xyxy -> (n, 4) in the filter's measurement form ('xyah' or 'xywh')."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    cx, cy = b[:, 0] + w / 2, b[:, 1] + h / 2
    third = w / np.maximum(h, 1e-9) if form == "xyah" else w
    return np.stack([cx, cy, third, h], 1)


def to_xyxy(z, form):
    """(n, 4) measurements -> xyxy."""
    z = np.asarray(z, dtype=np.float64).reshape(-1, 4)
    w = z[:, 2] * z[:, 3] if form == "xyah" else z[:, 2]
    h = z[:, 3]
    return np.stack([z[:, 0] - w / 2, z[:, 1] - h / 2, z[:, 0] + w / 2, z[:, 1] + h / 2], 1)
