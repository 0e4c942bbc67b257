"""--track at its edges, as a user meets them: frames of one pixel, sources whose names share a stem, a strided
video's MOT frame numbers, a long stream's memory, and the tracker YAML's mistakes named in one line."""

import numpy as np
import pytest

from engine.tracking.config import load_tracker_config, make_tracker


@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 7, 3), (3, 1, 3)])
def test_botsort_follows_a_frame_too_small_to_shrink(shape):
    """BoT-SORT's motion compensation shrinks each frame by 2 first: a 1-pixel side shrank to none and OpenCV's
    resize raised (a traceback from `--track botsort` on a 1 x 1 image). Now the camera is taken as still there,
    and the box keeps its id."""
    t = make_tracker(load_tracker_config("botsort"))
    frame = np.full(shape, 90, np.uint8)
    for _ in range(3):
        _, ids, boxes = t.update([[0, 0, 1, 1]], [0.9], [0], frame)
        assert ids.tolist() == [1]
        np.testing.assert_allclose(boxes, [[0, 0, 1, 1]], atol=1e-6)
