"""--track at its edges, as a user meets them: frames of one pixel, sources whose names share a stem, a strided
video's MOT frame numbers, a long stream's memory, and the tracker YAML's mistakes named in one line."""

import dataclasses
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from data.synthetic_video import render_video, write_video
from engine.track import FrameTracker
from engine.tracking.config import load_tracker_config, make_tracker
from engine.tracking.mot import TRAIL, Trails, read_mot
from evaluation.fields import Predictions
from utils.errors import BadOption
from utils.files import ConfigError

ROOT = Path(__file__).resolve().parents[2]


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


def _predictor(tmp_path, source, *argv):
    """detect.py's predictor, in this process, on the shapes checkpoint."""
    import detect
    from engine.tasks import TASKS

    weights = ROOT / "tests" / "models" / "fixtures" / "ultralytics-v8t-shapes.pt"
    opt = detect.parse_opt(["--weights", str(weights), "--source", str(source), "--img", "320", "--project",
                            str(tmp_path / "runs"), "--name", "t", *argv])
    return TASKS["detect"].predictor(opt)


def _track_run(tmp_path, source, *argv):
    """(the Results, the run folder) of detect.py's predictor on `source`."""
    predictor = _predictor(tmp_path, source, *argv)
    return list(predictor.stream()), predictor.save_dir


def test_two_videos_of_one_stem_keep_their_own_outputs_and_frame_numbers(tmp_path):
    """clip.avi and clip.mp4 in one folder: each its own MOT file, saved video and label files (they shared
    tracks/clip.txt, the second truncating the first's, clip.mp4 and labels/clip_<frame>.txt); with --vid-stride 2
    a MOT line's frame is the video's own (1, 3, 5, ...: the label files' numbers), not the count of frames read."""
    frames, _ = render_video(1, n_frames=12, size=(240, 320), n_objects=3)
    (tmp_path / "in").mkdir()
    for name in ("clip.avi", "clip.mp4"):
        write_video(frames, tmp_path / "in" / name)
    results, out = _track_run(tmp_path, tmp_path / "in", "--track", "--save-txt", "--vid-stride", "2")
    assert len(results) == 12
    assert sorted(p.name for p in out.glob("*.mp4")) == ["clip.mp4", "clip_mp4.mp4"]
    for stem in ("clip", "clip_mp4"):
        hyp = read_mot(out / "tracks" / f"{stem}.txt")
        assert len(hyp) >= 4 and set(hyp) <= {1, 3, 5, 7, 9, 11} and max(hyp) > 6  # 6 frames read of each
        for f, rows in hyp.items():
            label = np.loadtxt(out / "labels" / f"{stem}_{f}.txt", ndmin=2)
            assert len(label) == len(rows)


def test_a_long_stream_s_trails_forget_the_ids_gone(tmp_path):
    """A stream where a new object passes every frame: the trails kept are those of the ids drawn in the last TRAIL
    frames, not every id ever seen (they grew by one a frame, for as long as the stream ran); an id drawn on keeps
    its trail of the last TRAIL centres."""
    trails, im = Trails(), np.zeros((64, 64, 3), np.uint8)
    for f in range(1, 500):
        trails.draw(im, [[f % 50, 0, f % 50 + 4, 4], [0, 0, 10, 10]], [f + 1, 1])
        assert len(trails.paths) <= TRAIL + 1
    assert len(trails.paths[1]) == TRAIL and 499 in trails.paths


def _frames_in(path):
    cap = cv2.VideoCapture(str(path))
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if cap.isOpened() else 0
    cap.release()
    return n


def test_a_saved_video_is_whole_once_the_next_begins_or_the_caller_stops(tmp_path):
    """A folder of two videos: the first saved video is a playable file of all its frames as soon as the second
    begins (every writer stayed open to the run's end: a run killed on its 50th video left 49 files without their
    index, and as many writers open); a caller that stops early (`break` in a stream) leaves its frames so far."""
    frames, _ = render_video(1, n_frames=6, size=(240, 320), n_objects=3)
    (tmp_path / "in").mkdir()
    for name in ("a.mp4", "b.mp4"):
        write_video(frames, tmp_path / "in" / name)
    predictor = _predictor(tmp_path, tmp_path / "in", "--track")
    stream = predictor.stream()
    for r in stream:
        if Path(r.path).name == "b.mp4":
            break
    assert _frames_in(predictor.save_dir / "a.mp4") == 6
    next(stream)
    stream.close()
    assert _frames_in(predictor.save_dir / "b.mp4") == 2


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
@pytest.mark.parametrize("rotated", [False, True])
def test_a_box_of_no_width_or_height_is_not_tracked(name, rotated):
    """A box clipped wholly off the image (no width, or no height) is left out, as Ultralytics' trackers leave it:
    ByteTrack's filter (centre, w/h, h) made a 40 x 0 box a point and gave it id 1, the real box id 2."""
    t = make_tracker(load_tracker_config(name), rotated=rotated)
    if rotated:
        boxes = [[30, 10, 40, 0, 0.3], [60, 10, 0, 20, 0.3], [10, 10, 20, 20, 0.3]]
    else:
        boxes = [[10, 10, 50, 10], [60, 0, 60, 20], [0, 0, 20, 20]]
    for _ in range(3):
        idx, ids, _ = t.update(boxes, [0.9, 0.9, 0.9], [0, 0, 0])
        assert idx.tolist() == [2] and ids.tolist() == [1]


def _converging():
    """Object X still at (100, 100, 140, 140) on frames 1-5, then gone; object Y from frame 2 at 24 px to its right,
    moving 2 px left a frame onto X's place (frame 14) and staying: rows of xyxy, conf, cls."""
    out = []
    for f in range(1, 21):
        rows = [[100, 100, 140, 140, 0.9, 0]] if f <= 5 else []
        if f >= 2:
            off = max(0, 24 - 2 * (f - 2))
            rows.append([100 + off, 100, 140 + off, 140, 0.9, 0])
        out.append(np.array(rows, float))
    return out


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_a_track_followed_longer_outlasts_a_lost_one_it_runs_onto(name):
    """Y's track (id 2, followed frames 2-13) runs onto X's lost track (id 1, seen frames 1-5): Ultralytics 8.4.190's
    BYTETracker and BOTSORT (gmc_method none), fed this in the peers' venv, keep id 2 on Y every frame from 6 on.
    Ours measured the lost track's span to the current frame, dropped Y's track on frame 13 (Y missing from the
    frame) and gave Y id 1 from frame 14."""
    cfg = load_tracker_config(name)
    t = make_tracker(dataclasses.replace(cfg, gmc_method="none"))
    for f, d in enumerate(_converging(), 1):
        idx, ids, _ = t.update(d[:, :4], d[:, 4], d[:, 5])
        if f >= 6:
            assert idx.tolist() == [0] and ids.tolist() == [2], f


def test_persist_after_a_call_without_it_goes_on_with_that_call_s_tracks(tmp_path):
    """model.track(a.mp4) then model.track(b.mp4, persist=True), at the FrameTracker the API hands on: A (id 1)
    leaves, B (id 2) goes on into the second call and keeps id 2, and C, new there, takes id 3, as Ultralytics'
    reused tracker gives them. The second call started a fresh tracker: B came back as id 1, C as 2."""
    ft = FrameTracker("bytetrack", save_dir=tmp_path)
    im0 = np.zeros((200, 300, 3), np.uint8)
    a, b, c = [10, 10, 50, 50, 0.9, 0], [100, 100, 140, 140, 0.9, 0], [200, 20, 240, 60, 0.9, 0]
    for rows in ([a], [a, b], [a, b], [b]):
        _, ids = ft.update(Predictions(torch.tensor(rows)), im0, "a.mp4")
    assert ids.tolist() == [2]
    ft.one_sequence = True  # YOLO.track(persist=True) hands the last call's FrameTracker on so
    for rows in ([b], [b, c], [b, c]):
        _, ids = ft.update(Predictions(torch.tensor(rows)), im0, "b.mp4")
    assert ids.tolist() == [2, 3]


@pytest.mark.parametrize("argv,conf", [((), 0.25), (("--track",), 0.1), (("--track", "--conf-thres", "0.3"), 0.3),
                                       (("--conf-thres", "0.05"), 0.05)])
def test_track_takes_the_low_score_boxes_unless_told_otherwise(tmp_path, argv, conf):
    """--track's NMS keeps boxes from 0.1, as Ultralytics' track does: ByteTrack's second association matches the
    boxes between track_low_thresh (0.1) and track_high_thresh (0.25), which a cut at predict's 0.25 left it none
    of. A --conf-thres given is kept, with --track or not."""
    frames, _ = render_video(1, n_frames=1, size=(240, 320), n_objects=1)
    video = write_video(frames, tmp_path / "clip.mp4")
    assert _predictor(tmp_path, video, *argv).args.conf_thres == conf


TRACKER_KEYS = ("track_high_thresh: 0.5\ntrack_low_thresh: 0.1\nnew_track_thresh: 0.6\ntrack_buffer: 30\n"
                "match_thresh: 0.8\nfuse_score: true\n")


@pytest.mark.parametrize("text,why", [
    (f"tracker_type: bytetrack\n{TRACKER_KEYS}track_bufer: 10\n", r"track_bufer \(did you mean track_buffer\?\)"),
    (f"tracker_type: botsort\n{TRACKER_KEYS}with_reid: 'false'\n", "with_reid: 'false' is not a bool"),
    (f"tracker_type: botsort\n{TRACKER_KEYS}proximity_thresh: near\n", "proximity_thresh: 'near' is not a float"),
    (f"tracker_type: bytetrack\n{TRACKER_KEYS}".replace("30", "2.5"), "track_buffer: 2.5 is not an int"),
    (f"tracker_type: bytetrack\n{TRACKER_KEYS}".replace("low_thresh: 0.1", "low_thresh: 0.7"),
     "track_low_thresh 0.7 is above track_high_thresh 0.5"),
])
def test_a_tracker_yaml_s_mistake_names_the_key_and_what_it_takes(tmp_path, text, why):
    """A misspelt key names the key it is closest to; the re-identification keys are typed as the rest (the string
    'false' was refused as re-identification turned on); thresholds the wrong way round (low above high, which left
    ByteTrack's second association no box, without a word) are refused."""
    f = tmp_path / "t.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=why):
        load_tracker_config(f)


def test_one_s_own_botsort_yaml_in_the_working_folder_is_read(tmp_path, monkeypatch):
    """--track botsort.yaml where the working folder holds one (copied from Ultralytics and edited, as its guide
    says): that file, as Ultralytics reads it; the project's file was read instead, the edits silently unused. The
    bare name stays the project's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "botsort.yaml").write_text(f"tracker_type: botsort\n{TRACKER_KEYS}gmc_method: none\n")
    assert load_tracker_config("botsort.yaml").gmc_method == "none"
    assert load_tracker_config("botsort").gmc_method == "sparseOptFlow"


def test_an_empty_tracker_is_one_error_not_an_untracked_run(tmp_path):
    """`yolo track ... tracker=` (or --track '') ran predict with no tracker and not a word: refused before a run
    folder exists."""
    frames, _ = render_video(1, n_frames=1, size=(240, 320), n_objects=1)
    video = write_video(frames, tmp_path / "clip.mp4")
    with pytest.raises(BadOption, match="--track '': name a tracker"):
        _predictor(tmp_path, video, "--track", "")
    assert not (tmp_path / "runs").exists()


def test_a_video_whose_header_claims_an_absurd_frame_rate_is_taken_at_30(tmp_path):
    """An AVI whose stream header says 4e9 frames a second (OpenCV reads 2147483647): the saved video's writer
    failed to open (no video, though the run said its results were saved) and the tracker kept each lost track for
    2e9 frames (every object that ever passed a long stream, matched against each frame's boxes). Taken as 30."""
    frames, _ = render_video(1, n_frames=5, size=(240, 320), n_objects=2)
    path = tmp_path / "in.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (320, 240))
    for f in frames:
        writer.write(f)
    writer.release()
    data = bytearray(path.read_bytes())
    at = data.find(b"strh") + 28  # the stream header's dwScale, dwRate: rate / scale frames a second
    data[at:at + 8] = struct.pack("<II", 1, 4_000_000_000)
    path.write_bytes(bytes(data))
    predictor = _predictor(tmp_path, path, "--track")
    assert len(list(predictor.stream())) == 5
    assert _frames_in(predictor.save_dir / "in.mp4") == 5
    assert predictor.tracker.sources[str(path)][0].max_lost == 30


def test_a_tracked_row_s_label_line_ends_with_its_id_as_ultralytics_writes_it(tmp_path):
    """--track --save-txt --save-conf: `cls x y w h conf id` (Ultralytics 8.4.190's Results.save_txt order), the ids
    those of the result and of the MOT file's frame; r.save_txt writes the same lines; untracked, no id column."""
    frames, _ = render_video(2, n_frames=6, size=(240, 320), n_objects=3)
    (tmp_path / "in").mkdir()
    write_video(frames, tmp_path / "in" / "clip.mp4")
    results, out = _track_run(tmp_path, tmp_path / "in" / "clip.mp4", "--track", "--save-txt", "--save-conf")
    mot, checked = read_mot(out / "tracks" / "clip.txt"), 0
    for f, r in enumerate(results, 1):
        path = out / "labels" / f"clip_{f}.txt"
        if r.boxes.id is None or len(r.boxes) == 0:
            continue
        label = np.loadtxt(path, ndmin=2)
        assert label.shape == (len(r.boxes), 7)
        assert label[:, 6].tolist() == r.boxes.id.tolist() == mot[f][:, 0].tolist()
        np.testing.assert_allclose(label[:, 5], r.boxes.conf.numpy(), atol=1e-5)
        r.save_txt(tmp_path / "api.txt", save_conf=True)
        assert (tmp_path / "api.txt").read_text() == path.read_text()
        (tmp_path / "api.txt").unlink()
        checked += 1
    assert checked >= 3
    plain, out = _track_run(tmp_path, tmp_path / "in" / "clip.mp4", "--save-txt")
    assert np.loadtxt(out / "labels" / "clip_1.txt", ndmin=2).shape[1] == 5
