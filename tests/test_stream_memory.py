"""`predict(stream=True)` over a video holds one frame's Results at a time (what keeps its memory flat:
benchmarks/stream_memory.py measures the RSS, docs/performance.md has the figure), and the benchmark's own
arithmetic and run."""

import gc
import weakref

import pytest

from benchmarks import stream_memory
from yolo import YOLO


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return stream_memory.write_synthetic_video(tmp_path_factory.mktemp("v") / "v.mp4", 40, (120, 160))


def test_the_stream_lets_each_frames_results_go(video):
    """While suspended the generator may hold the frame it just gave (its locals); never one before it."""
    frames = []
    for r in YOLO(stream_memory.MODEL).predict(str(video), stream=True, imgsz=160, verbose=False):
        frames.append((weakref.ref(r), weakref.ref(r.record)))
        del r
        gc.collect()
        held = [i for i, refs in enumerate(frames[:-1]) if any(ref() is not None for ref in refs)]
        assert not held, f"frame {len(frames)}: frames {held} are still held"
    assert len(frames) == 40


def test_a_list_keeps_them_all(video):
    """The control: without stream=True every frame's Results is kept (so the test above can tell the two apart)."""
    results = YOLO(stream_memory.MODEL).predict(str(video), imgsz=160, verbose=False)
    refs = [weakref.ref(r) for r in results]
    gc.collect()
    assert len(refs) == 40 and all(ref() is not None for ref in refs)


def test_growth_is_the_slope_of_the_second_half():
    samples = [(f, 100.0 + (0.0 if f <= 500 else 0.002 * (f - 500)), 1) for f in range(100, 1100, 100)]
    assert stream_memory.growth_per_1000(samples) == pytest.approx(2.0)
    assert stream_memory.growth_per_1000([(100, 5.0, 0)]) == 0.0


def test_the_benchmark_runs_and_samples_every_few_frames(capsys):
    samples = stream_memory.main(["--frames", "60", "--every", "20", "--size", "96", "128", "--imgsz", "96"])
    assert [f for f, _, _ in samples] == [20, 40, 60] and all(m > 0 for _, m, _ in samples)
    assert "60 frames at imgsz 96: RSS" in capsys.readouterr().out
