"""Resident memory of `YOLO.predict(source=video, stream=True)` over a long video: it must stay flat, the generator
holding one frame's Results at a time (docs/performance.md, "Streaming predict memory").

    python -m benchmarks.stream_memory                       # 5,000 frames of 120 x 160 at imgsz 160
    python -m benchmarks.stream_memory --frames 500 --every 50

The video is the synthetic one (data/synthetic_video.py: shapes moving over a background), rendered and written a
chunk at a time so that the rendering holds no more than one chunk; the model, by default, is the small
Ultralytics-trained shapes detector of the tests (it finds the shapes, so every frame has boxes to hold). The
figures: RSS after the first `--every` frames (the model, the decoder and the first results warmed up), at the end,
the highest, and the growth per 1,000 frames fitted over the second half. A timing of nothing: no time is judged.
"""

import argparse
import gc
import os
import resource
import sys
import tempfile
from pathlib import Path

from utils.files import ROOT

MODEL = ROOT / "tests" / "models" / "fixtures" / "ultralytics-v8t-shapes.pt"
CHUNK = 250  # frames rendered at a time


def rss_mb():
    """This process's resident memory now, MB (Linux's /proc; elsewhere the peak so far, which is all there is)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_synthetic_video(path, frames, size):
    """`frames` frames of the synthetic video at `size` (h, w), each chunk a new seed's scene, as one mp4."""
    import cv2

    from data.synthetic_video import render_video

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 30, (size[1], size[0]))
    for seed, start in enumerate(range(0, frames, CHUNK)):
        chunk, _ = render_video(seed=seed, n_frames=min(CHUNK, frames - start), size=size)
        for f in chunk:
            writer.write(f)
    writer.release()
    return path


def measure(video, model=MODEL, imgsz=64, every=250, conf=0.25):
    """[(frames done, RSS MB, boxes in that frame)] every `every` frames of streaming `video` through `model`."""
    from yolo import YOLO

    samples = []
    stream = YOLO(model).predict(str(video), stream=True, imgsz=imgsz, conf=conf, verbose=False, device="cpu")
    for i, r in enumerate(stream, 1):
        if i % every == 0:
            gc.collect()
            samples.append((i, rss_mb(), len(r.boxes)))
    return samples


def growth_per_1000(samples):
    """Least-squares slope of RSS over frames in the second half of `samples`, MB per 1,000 frames."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return 0.0
    n = len(half)
    mx = sum(f for f, _, _ in half) / n
    my = sum(m for _, m, _ in half) / n
    var = sum((f - mx) ** 2 for f, _, _ in half)
    return 1000 * sum((f - mx) * (m - my) for f, m, _ in half) / var


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=5000)
    p.add_argument("--size", type=int, nargs=2, default=[120, 160], metavar=("H", "W"), help="the video's frames")
    p.add_argument("--imgsz", type=int, default=160)
    p.add_argument("--every", type=int, default=250, help="frames between RSS samples")
    p.add_argument("--model", default=str(MODEL))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        video = write_synthetic_video(Path(tmp) / "long.mp4", a.frames, tuple(a.size))
        gc.collect()
        before = rss_mb()
        samples = measure(video, a.model, a.imgsz, a.every)
    for f, m, n in samples:
        print(f"frame {f:6d}: RSS {m:7.1f} MB ({n} boxes)")
    mems = [m for _, m, _ in samples]
    print(f"{len(samples) and samples[-1][0]} frames at imgsz {a.imgsz}: RSS {before:.0f} MB before predicting, "
          f"{mems[0]:.0f} MB after {a.every} frames, {mems[-1]:.0f} MB at the end, {max(mems):.0f} MB highest; "
          f"growth {growth_per_1000(samples):+.2f} MB per 1,000 frames over the second half")
    return samples


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
