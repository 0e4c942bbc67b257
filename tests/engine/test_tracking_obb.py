"""Tracking oriented boxes: turning rectangles on the synthetic video (data/synthetic_video.py, `spin`) keep their ids
through the pillar with the detections an OBB model would give (angles in [0, pi/2), so the sides swap as the objects
turn), and `obb/predict.py --track` / `YOLO.track` put the ids on `r.obb.id` and write the MOT file."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from data.synthetic_video import detections, render_video, write_video
from engine.tracking.config import load_tracker_config, make_tracker
from engine.tracking.matching import same_turn
from engine.tracking.mot import read_mot
from utils.rotated import polygon_iou, xywhr_to_corners

ROOT = Path(__file__).resolve().parents[2]
VIDEO = {"n_frames": 150, "size": (240, 320), "n_objects": 6, "spin": 0.06}
FIXTURE = ROOT / "tests" / "models" / "fixtures" / "ultralytics-obb-tiny-11.pt"


def _still(tmp_path):
    """botsort.yaml without motion compensation (the still camera's flow follows the shapes: test_tracking.py)."""
    text = (ROOT / "data" / "trackers" / "botsort.yaml").read_text()
    f = tmp_path / "still.yaml"
    f.write_text(text.replace("gmc_method: sparseOptFlow", "gmc_method: none"))
    return f


def _iou(a, b):
    """Exact IoU of oriented boxes (xywhr) a (n, 5) and b (m, 5): their polygons' overlap."""
    a, b = (torch.from_numpy(np.asarray(x, dtype=np.float64).reshape(-1, 5)) for x in (a, b))
    return polygon_iou(xywhr_to_corners(a), xywhr_to_corners(b)).numpy()


def _track(name, frames, dets, rotated=True):
    """{frame: (n, 6) id, xywhr} of the tracks' boxes."""
    t = make_tracker(load_tracker_config(name), rotated=rotated)
    out = {}
    for f, (im, d) in enumerate(zip(frames, dets), 1):
        _, ids, boxes = t.update(np.c_[d[:, :4], d[:, 6]], d[:, 4], d[:, 5], im)
        out[f] = np.c_[ids, boxes]
    return out


def _ids_per_object(truth, hyp):
    """{true id: the track ids matched to it (polygon IoU >= 0.5)}, and how many frames each object was hidden."""
    ids_of, hidden = {}, {}
    for f, t in enumerate(truth, 1):
        h = hyp[f]
        m = _iou(t[:, 2:7], h[:, 1:6])
        for k, row in enumerate(t):
            if row[7] < 0.3:
                hidden[int(row[0])] = hidden.get(int(row[0]), 0) + 1
            elif m.shape[1] and m[k].max() >= 0.5:
                ids_of.setdefault(int(row[0]), set()).add(int(h[m[k].argmax(), 0]))
    return ids_of, hidden


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_turning_objects_keep_their_ids_through_the_pillar(name, tmp_path):
    frames, truth = render_video(1, **VIDEO)
    dets = detections(truth, 1, false_rate=0, size=VIDEO["size"])
    swaps = sum(int(np.sign(a[0, 2] - a[0, 3]) != np.sign(b[0, 2] - b[0, 3])) for a, b in zip(dets, dets[1:])
                if len(a) and len(b))
    assert swaps >= 3  # the reported sides do swap as the first object turns through the angle's wrap
    hyp = _track(name if name == "bytetrack" else _still(tmp_path), frames, dets)
    ids_of, hidden = _ids_per_object(truth, hyp)
    occluded = [i for i, n in hidden.items() if n >= 3]
    assert len(occluded) >= 2 and len(ids_of) == VIDEO["n_objects"]
    assert all(len(v) == 1 for v in ids_of.values()), ids_of  # every object, not only the occluded ones
    assert len(set().union(*ids_of.values())) == VIDEO["n_objects"]


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_a_track_s_box_follows_an_object_turning_through_the_angle_s_wrap(name):
    """One 60 x 20 box turning 0.1 rad a frame, reported as a model does (angle in [0, pi/2): its sides swap at
    each quarter turn): the filter's box stays on it. Were the swapped sides fed to the filter as they come, its
    width and height would average towards a square (IoU about 0.5 after a swap)."""
    t = make_tracker(load_tracker_config(name), rotated=True)
    for f in range(40):
        r = 0.1 * f
        reported = np.array([[80.0 + f, 60.0, 60.0, 20.0, r]])
        if math.fmod(r, math.pi) >= math.pi / 2:
            reported[0, 2:] = 20.0, 60.0, math.fmod(r, math.pi / 2)
        reported[0, 4] = math.fmod(reported[0, 4], math.pi / 2)
        _, ids, boxes = t.update(reported, [0.9], [0])
        assert ids.tolist() == [1]
        assert _iou(boxes, reported)[0, 0] > 0.9, f


# Ultralytics 8.4.190's BYTETracker and BOTSORT (their default YAMLs) fed the oriented detections of seed 0 in its
# predict's form (benchmarks/track_synthetic_obb.py, run in the peers' venv), scored by polygon IoU: MOTA, IDF1
ULTRALYTICS = {"bytetrack": (0.896667, 0.911007), "botsort": (0.883333, 0.770858)}


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_mota_and_idf1_against_ultralytics_on_the_same_oriented_detections(name, tmp_path):
    """ByteTrack at least Ultralytics'; BoT-SORT within one missed box in 900 (its flow-based camera motion differs
    in small ways: one more miss on seeds 0 and 1, the same on seed 2)."""
    pytest.importorskip("motmetrics")
    from benchmarks.track_synthetic_obb import run, score

    np.save(tmp_path / "ours.npy", run(name, False, 0, None))
    s = score([str(tmp_path / "ours.npy")], [0])
    mota, idf1 = ULTRALYTICS[name]
    slack = 0 if name == "bytetrack" else 1 / 900
    assert s["mota"].iloc[0] >= mota - slack - 1e-6 and s["idf1"].iloc[0] >= idf1 - slack - 1e-6


def test_same_turn_is_the_same_rectangle_nearest_the_track_s_angle():
    box = np.array([50.0, 40.0, 30.0, 10.0, 0.1])
    for angle, quarters in ((0.2, 0), (1.6, 1), (-1.5, -1), (3.3, 2), (math.pi / 2 + 0.1, 1)):
        track = np.r_[50.0, 40.0, (30.0, 10.0) if quarters % 2 == 0 else (10.0, 30.0), angle]
        b = same_turn(box, track)
        assert abs(b[4] - (box[4] + quarters * math.pi / 2)) < 1e-12
        assert tuple(b[2:4]) == tuple(track[2:4])
        corners = [xywhr_to_corners(torch.from_numpy(x)[None]) for x in (box, b)]
        assert polygon_iou(*corners).item() == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("turned", [0.94, -0.94, 1.2])
def test_same_turn_keeps_the_track_s_sides_after_a_turn_of_more_than_an_eighth(turned):
    """An object (40 x 16) that turned `turned` rad while hidden, found again: the angle nearest the track's would
    swap its sides against the track's (the long side given to the filter as h); the rectangle is written with the
    track's long side as w, at the object's own angle (mod pi)."""
    track = np.array([100.0, 50.0, 40.0, 16.0, 0.5])
    r = 0.5 + turned
    reported = np.array([100.0, 50.0, 40.0, 16.0, r % (math.pi / 2)])  # as a model reports it: angle in [0, pi/2)
    if r % math.pi >= math.pi / 2:
        reported[2:4] = 16.0, 40.0
    b = same_turn(reported, track)
    assert tuple(b[2:4]) == (40.0, 16.0)
    assert math.remainder(b[4] - r, math.pi) == pytest.approx(0.0, abs=1e-12)


def _video(tmp_path, n=12):
    """A still scene filmed n frames: a seeded OBB model gives each frame the same boxes, so each must keep its id."""
    frames, _ = render_video(2, n_frames=1, size=(96, 160), n_objects=3, spin=0.0)
    return write_video(frames * n, tmp_path / "still.mp4")


@pytest.mark.parametrize("how", ["script", "yolo"])
def test_obb_predict_track_writes_ids_and_the_mot_file(tmp_path, how):
    video = _video(tmp_path)
    command = [str(ROOT / "obb" / "predict.py"), "--weights", str(FIXTURE), "--source", str(video), "--img", "128",
               "--track", "bytetrack", "--project", str(tmp_path), "--name", "t", "--device", "cpu"]
    if how == "yolo":
        command = ["-m", "yolo", "obb", "track", f"model={FIXTURE}", f"source={video}", "imgsz=128",
                   f"project={tmp_path}", "name=t", "device=cpu"]
    run = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    hyp = read_mot(tmp_path / "t" / "tracks" / "still.txt")
    assert sorted(hyp) == list(range(1, 13))
    first = hyp[1]
    assert len(first) >= 3
    for f in range(2, 13):  # the same ids on the same boxes (their upright envelopes, as MOT writes them)
        np.testing.assert_allclose(hyp[f], first, atol=0.02)
    assert (tmp_path / "t" / "still.mp4").stat().st_size > 1000


def test_the_api_puts_track_ids_on_r_obb(tmp_path):
    from yolo import YOLO

    video = _video(tmp_path, n=5)
    results = YOLO(str(FIXTURE)).track(str(video), imgsz=128, device="cpu", verbose=False)
    assert len(results) == 5 and all(r.boxes is None for r in results)
    ids = [r.obb.id.tolist() for r in results]
    assert ids[0] and all(i == ids[0] for i in ids) and len(set(ids[0])) == len(ids[0])
    r = results[-1]
    assert r.obb.is_track and r.obb.data.shape == (len(r), 8)  # Ultralytics' table: x, y, w, h, r, id, conf, cls
    torch.testing.assert_close(r.obb.data[:, 5], r.obb.id.to(r.obb.data.dtype))
    torch.testing.assert_close(r.obb.data[:, 6:], torch.stack((r.obb.conf, r.obb.cls), 1))
    assert r.obb[0].id.shape == (1,) and r.numpy().obb.id.dtype == np.int64
    assert [row["track_id"] for row in r.summary()] == r.obb.id.tolist()
