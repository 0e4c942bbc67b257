"""Live sources served by a loopback HTTP server: an MJPEG stream, a stream that stalls, a video file URL."""

import http.server
import threading
import time

import cv2
import numpy as np
import pytest
import torch

from data.sources import LoadImages
from data.streams import LoadStreams, open_source
from utils.errors import BadFile

N_FRAMES = 12
STALL_AFTER = 6  # frames the stalling stream sends (enough for the reader to open it)

@pytest.fixture
def log(caplog):
    """Records of the project logger (it does not propagate to the root logger once set_logging has run)."""
    from utils.log import LOGGER

    LOGGER.addHandler(caplog.handler)
    yield caplog
    LOGGER.removeHandler(caplog.handler)



def frame(k, size=64):
    """Frame k: uniform grey level 20 * k, so a decoded frame tells which one it is."""
    return np.full((size, size, 3), 20 * k, np.uint8)


def frame_index(im):
    return int(round(float(im.mean()) / 20))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Pace:
    """Frames the loader has handed out. The /paced-<vid_stride> stream sends a frame the reader will decode only
    once every frame decoded before it has been handed out, so none is replaced unread however slow a busy machine
    makes inference: the counts are exact without timing assumptions. Opening a stream reads its first 3 frames
    (FFmpeg's probe) and the reader then decodes them in a burst, so with vid_stride 3 the burst holds one frame to
    decode. (The /live stream is paced by the clock, as a camera is, for the test where skipping is the point.)"""

    def __init__(self):
        self.cond, self.taken = threading.Condition(), 0

    def handed_out(self):
        with self.cond:
            self.taken += 1
            self.cond.notify_all()

    def wait_for(self, n):
        with self.cond:
            # bounded: should the reader need more bytes before it delivers a frame, the stream goes on rather than
            # hang, and the exact counts then fail
            self.cond.wait_for(lambda: self.taken >= n, timeout=15)


PACE = _Pace()


def _handler(video_bytes, release, hits):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            hits.append(self.path)
            if self.path == "/clip.mp4":
                self.send_response(200)
                self.send_header("Content-Type", "video/mp4")
                self.send_header("Content-Length", str(len(video_bytes)))
                self.end_headers()
                self.wfile.write(video_bytes)
                return
            stall, paced = self.path.startswith("/stall"), self.path.startswith("/paced")
            stride = int(self.path.rsplit("-", 1)[1]) if paced else 1
            self.send_response(200)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.end_headers()
            for k in range(STALL_AFTER if stall else N_FRAMES):
                if paced and k % stride == 0:
                    PACE.wait_for(k // stride)  # the decoded frames 0, stride, ..., k - stride: handed out
                jpg = cv2.imencode(".jpg", frame(k))[1].tobytes()
                self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpg))
                self.wfile.write(jpg + b"\r\n")
                self.wfile.flush()
                # clock-paced, as a camera is: a pause after the first frame while the reader opens the stream,
                # then 5 fps
                if not paced:
                    time.sleep(2.0 if k == 0 else 0.2)
            if stall:
                release.wait(30)  # connection open, nothing sent: the reader blocks in the network read

    return Handler


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    video = tmp_path_factory.mktemp("video") / "clip.mp4"
    w = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 64))
    for k in range(N_FRAMES):
        w.write(frame(k))
    w.release()
    release, hits = threading.Event(), []
    srv = _Server(("127.0.0.1", 0), _handler(video.read_bytes(), release, hits))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    release.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def paced(server, monkeypatch):
    """The URL of the /paced stream at vid_stride `stride`, with the loader counting the frames it hands out."""
    take = LoadStreams._take

    def counted(self):
        item = take(self)
        if item is not None:
            PACE.handed_out()
        return item

    PACE.taken = 0
    monkeypatch.setattr(LoadStreams, "_take", counted)
    return lambda stride: f"{server[0]}/paced-{stride}"


def _frames(loader):
    return [(path, frame_index(im0)) for path, im, im0, _ in loader]


def test_mjpeg_stream_with_vid_stride_then_it_ends(paced, log):
    t0 = time.monotonic()
    got = _frames(open_source(paced(3), imgsz=64, vid_stride=3))
    assert [k for _, k in got] == list(range(0, N_FRAMES, 3))  # frames 1, 4, 7, 10 (1-based): grey 0, 3, 6, 9
    assert time.monotonic() - t0 < 20
    assert any("ended or was lost after 4 frames (0 skipped" in r.message for r in log.records)


def test_a_stalled_stream_is_given_up_and_the_other_goes_on(server, tmp_path, log):
    url, _ = server
    listing = tmp_path / "cams.streams"
    listing.write_text(f"{url}/stall\n{url}/live\n")
    t0 = time.monotonic()
    loader = LoadStreams(listing.read_text().split(), imgsz=64, timeout=3.0)
    got = _frames(loader)
    assert time.monotonic() - t0 < 25
    per_source = {p: [k for q, k in got if q == p] for p in loader.sources}
    stalled = per_source[f"{url}/stall"]  # sent while the other stream was still opening: older ones are skipped
    assert stalled and stalled == sorted(set(stalled)) and stalled[-1] == STALL_AFTER - 1
    # the live stream goes on to its end; how many of its frames a busy machine skips while the stalled one is still
    # being opened depends on scheduling, but they are never repeated or reordered, and the warning counts them
    live = per_source[f"{url}/live"]
    assert live == sorted(set(live)) and live[-1] == N_FRAMES - 1
    skipped = N_FRAMES - len(live)
    assert any(f"live ended or was lost after {N_FRAMES} frames ({skipped} skipped" in r.message for r in log.records)
    assert any(f"stall ended or was lost after {STALL_AFTER} frames" in r.message for r in log.records)


def test_video_url_is_downloaded_once(server, tmp_path, monkeypatch):
    url, hits = server
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        loader = open_source(f"{url}/clip.mp4", imgsz=64, vid_stride=2)
        assert isinstance(loader, LoadImages)
        got = [(loader.frame, frame_index(im0)) for _, _, im0, _ in loader]
        assert [f for f, _ in got] == [1, 3, 5, 7, 9, 11]
        assert [abs(k - (f - 1)) <= 1 for f, k in got] == [True] * 6  # mp4v is lossy: grey levels within one step
    assert hits.count("/clip.mp4") == 1 and (tmp_path / "clip.mp4").is_file()


def test_missing_webcam_and_streams_file_are_user_errors(tmp_path):
    with pytest.raises(BadFile, match="cannot open"):
        open_source("7", imgsz=64)  # no /dev/video7 here
    with pytest.raises(BadFile, match="not found"):
        open_source(str(tmp_path / "none.streams"))
    (tmp_path / "empty.streams").write_text("# no streams\n")
    assert isinstance(pytest.raises(BadFile, open_source, str(tmp_path / "empty.streams")).value, BadFile)


def test_detect_script_processes_every_third_stream_frame(paced, tmp_path):
    import detect
    from models.checkpoints import model_to_ckpt
    from models.yolo import DetectionModel

    weights = tmp_path / "v5n.pt"
    torch.save({"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=3))}, weights)
    opt = detect.parse_opt(["--weights", str(weights), "--source", paced(3), "--imgsz", "64", "--vid-stride",
                            "3", "--device", "cpu", "--project", str(tmp_path / "runs"), "--name", "exp"])
    results = detect.main(opt)
    assert len(results) == N_FRAMES // 3
    out = cv2.VideoCapture(str(tmp_path / "runs" / "exp" / "paced-3.mp4"))
    assert int(out.get(cv2.CAP_PROP_FRAME_COUNT)) == N_FRAMES // 3
