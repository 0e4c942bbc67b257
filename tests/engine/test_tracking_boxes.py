"""What a tracked result's box is: the track's, where its Kalman filter puts it after the frame's detection (as
Ultralytics' trackers report it), not the detection's; the detection's confidence, class, masks and keypoint columns
go with it. Against Ultralytics 8.4.190's boxes on the same detections, against the truth of a jittered
constant-velocity box, and through --track's FrameTracker into the record and the MOT file."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from engine.track import FrameTracker
from engine.tracking.config import load_tracker_config, make_tracker
from engine.tracking.mot import read_mot
from evaluation.fields import Predictions
from utils.rotated import polygon_iou, regularize, xywhr_to_corners


def _sequence():
    """Two boxes moving at constant velocity over 15 frames, each corner jittered N(0, 1.5 px) (seed 0): rows of
    xyxy, conf, cls. The second's score drops to 0.3 on frame 9: ByteTrack's second association holds it."""
    rng = np.random.default_rng(0)
    out = []
    for f in range(15):
        a = np.array([20, 30, 60, 110.0]) + [3 * f, f, 3 * f, f]
        b = np.array([150, 40, 190, 100.0]) + [-2 * f, 2 * f, -2 * f, 2 * f]
        boxes = np.stack([a, b]) + rng.normal(0, 1.5, (2, 4))
        out.append(np.c_[boxes, [0.9, 0.3 if f == 8 else 0.85], [0, 1]])
    return out


# Ultralytics 8.4.190's BYTETracker and BOTSORT (their default YAMLs, gmc_method none) fed _sequence() in the peers'
# venv: per frame the xyxy its `update` returns for ids 1 and 2 (always both, in that order, indices 0 and 1)
ULTRALYTICS = {
    "bytetrack": [
        [[20.1886, 29.8018, 60.9606, 110.1573], [149.1965, 40.5424, 191.9560, 101.4206]],
        [[21.0907, 29.1944, 62.5406, 110.9424], [145.1390, 41.5225, 186.8941, 100.9702]],
        [[24.2452, 30.9658, 65.8423, 113.0133], [144.7472, 45.1365, 185.8607, 103.7480]],
        [[28.4119, 32.7718, 68.5874, 112.1834], [142.5671, 46.4342, 183.9047, 105.4954]],
        [[31.5883, 34.5595, 71.8029, 114.0280], [140.5570, 47.8455, 183.5351, 109.3486]],
        [[34.7352, 36.8605, 74.8827, 115.7852], [139.1815, 49.4722, 183.0814, 112.4818]],
        [[39.4473, 38.0856, 78.4931, 114.9530], [136.8185, 52.3630, 179.0491, 113.2738]],
        [[41.2779, 38.4875, 80.4618, 115.8810], [135.5910, 52.8262, 177.9815, 113.8785]],
        [[44.4433, 38.2817, 85.2755, 118.9067], [132.9532, 53.2338, 176.5644, 116.5869]],
        [[48.4986, 38.4802, 88.8632, 118.0003], [130.6703, 57.7950, 173.5056, 120.1655]],
        [[50.3788, 39.1573, 90.5679, 118.4998], [128.5916, 60.5084, 170.9370, 122.0642]],
        [[52.4198, 42.3785, 92.7741, 122.0053], [126.5282, 61.4061, 169.2544, 123.7553]],
        [[55.2698, 41.9312, 95.1441, 120.9666], [126.0366, 64.7191, 166.3467, 123.5421]],
        [[58.3462, 41.6849, 99.1356, 123.2243], [122.2981, 66.6209, 163.0581, 125.8949]],
        [[62.1673, 43.6875, 102.1717, 123.3324], [122.1138, 68.9264, 163.2593, 129.0827]],
    ],
    "botsort": [
        [[20.1886, 29.8018, 60.9606, 110.1573], [149.1965, 40.5424, 191.9560, 101.4206]],
        [[21.7122, 29.1944, 61.9190, 110.9424], [145.1318, 41.5225, 186.9014, 100.9702]],
        [[24.5125, 30.9658, 65.6525, 113.0133], [145.4576, 45.1365, 185.1502, 103.7480]],
        [[29.2652, 32.7718, 67.7520, 112.1834], [143.6803, 46.4342, 182.7486, 105.4954]],
        [[31.7735, 34.5595, 71.6673, 114.0280], [141.4494, 47.8455, 182.6295, 109.3486]],
        [[33.4573, 36.8605, 76.1763, 115.7852], [140.3217, 49.4722, 181.9367, 112.4818]],
        [[39.1220, 38.0856, 78.7157, 114.9530], [138.3170, 52.3630, 177.5038, 113.2738]],
        [[41.7726, 38.4875, 79.9149, 115.8810], [135.8037, 52.8262, 177.7607, 113.8785]],
        [[44.5486, 38.2817, 85.1938, 118.9067], [134.6997, 53.2338, 174.8302, 116.5869]],
        [[48.1449, 38.4802, 89.2200, 118.0003], [131.6882, 57.7950, 172.4206, 120.1655]],
        [[50.5652, 39.1573, 90.4148, 118.4998], [128.6953, 60.5084, 170.8009, 122.0642]],
        [[52.3897, 42.3785, 92.8100, 122.0053], [127.1566, 61.4061, 168.6063, 123.7553]],
        [[55.8786, 41.9312, 94.5424, 120.9666], [126.2676, 64.7191, 166.1024, 123.5421]],
        [[59.8026, 41.6849, 97.7068, 123.2243], [121.8859, 66.6209, 163.4798, 125.8949]],
        [[62.1823, 43.6875, 102.2019, 123.3324], [122.6461, 68.9264, 162.6592, 129.0827]],
    ],
}


def _config(name):
    cfg = load_tracker_config(name)
    return dataclasses.replace(cfg, gmc_method="none") if name == "botsort" else cfg


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_the_tracks_boxes_are_ultralytics_on_the_same_detections(name):
    t = make_tracker(_config(name))
    for f, (d, expected) in enumerate(zip(_sequence(), ULTRALYTICS[name]), 1):
        idx, ids, boxes = t.update(d[:, :4], d[:, 4], d[:, 5])
        assert idx.tolist() == [0, 1] and ids.tolist() == [1, 2], f
        np.testing.assert_allclose(boxes, expected, atol=2e-4, err_msg=f"frame {f}")
        if f > 1:  # the filter's box, not the detection's
            assert np.abs(boxes - d[:, :4]).max() > 0.1, f


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_the_track_s_box_is_nearer_the_truth_than_its_detections(name):
    """One 40 x 80 box moving (3, 1) px a frame, its corners jittered N(0, 2 px), 60 frames: frame 1's box is the
    detection's (the filter starts there); from then on the filter's, which differs from each detection and, over
    the last 50 frames, lies nearer the truth (mean absolute corner error at most 0.8 x the detections')."""
    rng = np.random.default_rng(1)
    t = make_tracker(_config(name))
    err_track, err_det = [], []
    for f in range(60):
        truth = np.array([10.0, 20.0, 50.0, 100.0]) + [3 * f, f, 3 * f, f]
        det = truth + rng.normal(0, 2.0, 4)
        idx, ids, boxes = t.update(det[None], [0.9], [0])
        assert idx.tolist() == [0] and ids.tolist() == [1]
        if f == 0:
            np.testing.assert_allclose(boxes[0], det, atol=1e-9)
            continue
        assert np.abs(boxes[0] - det).max() > 1e-3
        if f >= 10:
            err_track.append(np.abs(boxes[0] - truth).mean())
            err_det.append(np.abs(det - truth).mean())
    assert np.mean(err_track) <= 0.8 * np.mean(err_det), (np.mean(err_track), np.mean(err_det))


def test_frame_tracker_puts_the_track_s_box_in_the_record_and_the_mot_file(tmp_path):
    """--track's record: each row's box the track's (clipped to the image, as Ultralytics clips its results), its
    confidence, class and later columns (keypoints, mask coefficients) the detection's, its mask the detection's; the
    MOT file holds the boxes the record holds."""
    ft = FrameTracker("bytetrack", save_dir=tmp_path)
    im0 = np.zeros((120, 160, 3), np.uint8)
    ref = make_tracker(load_tracker_config("bytetrack"))
    rng = np.random.default_rng(2)
    for f in range(6):
        rows = np.array([[120.0 + 8 * f, 10, 150 + 8 * f, 40, 0.9, 3, 7.5], [20, 60, 50, 90, 0.8, 1, 2.5]])
        rows[:, :4] += rng.normal(0, 1.5, (2, 4))
        masks = torch.arange(2, dtype=torch.float32)[:, None, None].expand(2, 120, 160)
        record, ids = ft.update(Predictions(torch.from_numpy(rows).float(), masks=masks), im0, "clip.mp4")
        idx, ref_ids, boxes = ref.update(rows[:, :4], rows[:, 4], rows[:, 5])
        order = np.argsort(ref_ids)
        assert ids.tolist() == ref_ids[order].tolist()
        expected = boxes[order].clip(0, [160, 120, 160, 120])
        np.testing.assert_allclose(record.boxes[:, :4].numpy(), expected, atol=1e-4)
        np.testing.assert_allclose(record.boxes[:, 4:].numpy(), rows[idx[order], 4:], atol=1e-6)
        assert record.masks[:, 0, 0].tolist() == idx[order].tolist()
    assert expected[0, 2] == 160 and boxes[order][0, 2] > 160  # the first box runs off the right edge
    mot = read_mot(tmp_path / "tracks" / "clip.txt")[6]
    np.testing.assert_allclose(mot[:, 1:], record.boxes[:, :4].numpy(), atol=0.01)


def test_frame_tracker_gives_an_oriented_track_s_box_in_the_predictions_form(tmp_path):
    """A 60 x 20 box turning 0.1 rad a frame, reported as a model does (angle in [0, pi/2), the sides swapping at
    each quarter turn): the record's row (x, y, w, h, conf, cls, angle) is the track's box, the same rectangle,
    written back in that form though the track's own angle has gone past pi/2; the MOT file holds its envelope."""
    ft = FrameTracker("bytetrack", save_dir=tmp_path, rotated=True)
    ref = make_tracker(load_tracker_config("bytetrack"), rotated=True)
    im0 = np.zeros((200, 300, 3), np.uint8)
    past_wrap = False
    for f in range(25):
        r = 0.1 * f
        box = torch.tensor([[100.0 + 2 * f, 100.0, 60.0, 20.0, r]], dtype=torch.float64)
        reported = regularize(box).numpy()
        record, ids = ft.update(Predictions(torch.from_numpy(np.c_[reported[:, :4], [[0.9, 2]], reported[:, 4]])),
                                im0, "spin.mp4")
        _, _, boxes = ref.update(reported, [0.9], [2])
        past_wrap |= bool(boxes[0, 4] >= math.pi / 2)
        row = record.boxes.numpy()
        assert ids.tolist() == [1] and row[0, 4:6].tolist() == [0.9, 2]
        assert 0 <= row[0, 6] < math.pi / 2
        np.testing.assert_allclose(np.r_[row[0, :4], row[0, 6]], regularize(torch.from_numpy(boxes)).numpy()[0],
                                   atol=1e-9)
        same = polygon_iou(xywhr_to_corners(torch.from_numpy(boxes)),
                           xywhr_to_corners(torch.from_numpy(np.r_[row[0, :4], row[0, 6]][None])))
        assert same.item() == pytest.approx(1.0, abs=1e-6)
    assert past_wrap
    corners = xywhr_to_corners(torch.from_numpy(np.r_[row[0, :4], row[0, 6]][None])).numpy()[0]
    mot = read_mot(tmp_path / "tracks" / "spin.txt")[25]
    np.testing.assert_allclose(mot[0, 1:], np.r_[corners.min(0), corners.max(0)], atol=0.01)
