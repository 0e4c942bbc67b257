"""Global motion compensation by sparse optical flow (BoT-SORT's `sparseOptFlow`): the camera's motion between two
frames as a similarity transform, estimated from corners tracked by Lucas-Kanade flow, so that a panning camera does
not read as every object moving."""

import cv2
import numpy as np


class SparseFlowGMC:
    """`downscale`: the frames are shrunk by this factor first (corners and flow on fewer pixels)."""

    def __init__(self, downscale=2):
        self.downscale = max(1, int(downscale))
        self.prev, self.prev_points = None, None

    def _grey(self, frame):
        grey = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY) if frame.ndim == 3 else frame
        if self.downscale > 1:  # a side under the factor stays one pixel (a 1-pixel frame: no size at all)
            h, w = grey.shape
            grey = cv2.resize(grey, (max(1, w // self.downscale), max(1, h // self.downscale)))
        return grey

    def apply(self, frame):
        """The 2 x 3 affine that takes the last frame's coordinates to this one's (identity on the first frame, or
        where too few corners are followed)."""
        grey = self._grey(frame)
        points = cv2.goodFeaturesToTrack(grey, maxCorners=1000, qualityLevel=0.01, minDistance=1, blockSize=3)
        H = np.eye(2, 3)
        prev, prev_points = self.prev, self.prev_points
        self.prev, self.prev_points = grey, points
        if prev is None or prev_points is None or len(prev_points) < 4 or prev.shape != grey.shape:
            return H
        moved, status, _ = cv2.calcOpticalFlowPyrLK(prev, grey, prev_points, None)
        ok = status.reshape(-1).astype(bool)
        if ok.sum() < 4:
            return H
        A, _ = cv2.estimateAffinePartial2D(prev_points[ok], moved[ok], method=cv2.RANSAC)
        if A is None:
            return H
        A[:, 2] *= self.downscale  # the shift back in full-size pixels
        return A
