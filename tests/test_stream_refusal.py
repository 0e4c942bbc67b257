"""A live source that will be refused reads no frame first (issue 61, round 2; data/streams.py): the sources of a
.streams file opened in their own threads and each began reading frames as soon as it had opened, while the sources
still opening could take the set past its pixel budget (or fail to open) and have the command refused. Now no reader
grabs a frame before every source has opened and the set is accepted; and a predictor's own refusals (a tracker's
settings) come before any source opens.
"""

import threading
import time

import cv2
import numpy as np
import pytest

from data.streams import LoadStreams
from tests.test_bounded_cost import cli, tiny_checkpoint
from utils.budget import MAX_STREAM_PIXELS
from utils.errors import BadFile


class CountingCapture:
    """A capture of a 4K stream that counts what is done with it; every source after the first takes 0.3 s to open
    (a slow camera), so a reader that did not wait for the others would have grabbed frames meanwhile."""

    opened, grabs, released = [], [], []
    lock = threading.Lock()

    def __init__(self, source, *args):
        if str(source) != "rtsp://127.0.0.1:9/cam0":
            time.sleep(0.3)
        with self.lock:
            self.opened.append(source)
        self.source, self.n = source, 0

    def isOpened(self):  # noqa: N802 (OpenCV's names)
        return not str(self.source).endswith("dead")

    def get(self, prop):
        return {cv2.CAP_PROP_FRAME_WIDTH: 3840, cv2.CAP_PROP_FRAME_HEIGHT: 2160, cv2.CAP_PROP_FPS: 30}.get(prop, 0)

    def grab(self):
        with self.lock:
            self.grabs.append(self.source)
        self.n += 1
        return self.n <= 3  # then the stream ends

    def retrieve(self):
        return True, np.zeros((8, 8, 3), np.uint8)  # what a frame holds matters not: only that it was read

    def release(self):
        with self.lock:
            self.released.append(self.source)


@pytest.fixture
def capture(monkeypatch):
    for name in ("opened", "grabs", "released"):
        monkeypatch.setattr(CountingCapture, name, [])
    monkeypatch.setattr(cv2, "VideoCapture", CountingCapture)
    return CountingCapture


@pytest.mark.parametrize("last", ["rtsp://127.0.0.1:9/cam4", "rtsp://127.0.0.1:9/dead"])
def test_sources_refused_together_read_no_frame(capture, last):
    """Five 4K sources (over the pixel budget), or four and one that cannot open: refused, no frame grabbed, every
    capture that opened released."""
    sources = [f"rtsp://127.0.0.1:9/cam{k}" for k in range(4)] + [last]
    assert 4 * 3840 * 2160 <= MAX_STREAM_PIXELS < 5 * 3840 * 2160
    with pytest.raises(BadFile):
        LoadStreams(sources, imgsz=64, timeout=2)
    assert len(capture.opened) == 5 and capture.grabs == []
    assert sorted(capture.released) == sorted(s for s in sources if not s.endswith("dead"))


def test_sources_accepted_read_once_all_have_opened(capture):
    streams = LoadStreams([f"rtsp://127.0.0.1:9/cam{k}" for k in range(4)], imgsz=64, timeout=2)
    frames = list(streams)  # until every stream has ended
    assert len(frames) >= 4 and set(capture.grabs) == set(capture.opened) and len(capture.opened) == 4


def test_a_tracker_refused_opens_no_source(capture, tmp_path, capsys):
    """--track with a tracker file that does not exist was refused after the stream had opened and read frames."""
    weights = tiny_checkpoint(tmp_path / "w.pt", train_imgsz=64)
    code, errors = cli(["detect.py", "--weights", str(weights), "--source", "rtsp://127.0.0.1:9/cam0", "--track",
                        str(tmp_path / "none.yaml"), "--device", "cpu", "--project", str(tmp_path / "r")], capsys)
    assert code == 2 and len(errors) == 1 and "none.yaml" in errors[0]
    assert capture.opened == [] and capture.grabs == []
