import os

import cv2
import numpy as np
import pytest

from utils.imageio import read_image


@pytest.mark.parametrize("name", ["plain.jpg", "caf\udce9.jpg"])  # the second: Latin-1 bytes, not UTF-8
@pytest.mark.parametrize("reduce", [1, 2, 4, 8])
def test_read_image_reduced_rounds_each_side_up(tmp_path, name, reduce):
    im = np.zeros((301, 150, 3), np.uint8)
    im[:, 75:] = 200
    ok, buf = cv2.imencode(".jpg", im)
    path = os.fsencode(tmp_path) + b"/" + os.fsencode(name)
    with open(path, "wb") as f:
        f.write(buf.tobytes())
    got = read_image(os.fsdecode(path), reduce)
    assert got.shape == (-(-301 // reduce), -(-150 // reduce), 3)
    assert abs(float(got[:, : got.shape[1] // 2 - 1].mean()) - 0) < 3 and abs(float(got[:, -1].mean()) - 200) < 3
