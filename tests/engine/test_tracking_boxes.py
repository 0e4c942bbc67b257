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
    """Boxes moving at constant velocity over 15 frames, each corner jittered N(0, 1.5 px) (seed 0): rows of xyxy,
    conf, cls. The second's score drops to 0.3 on frame 9 (ByteTrack's second association holds it); a third comes
    in on frame 5 (a tentative track, confirmed on frame 6)."""
    rng = np.random.default_rng(0)
    out = []
    for f in range(15):
        a = np.array([20, 30, 60, 110.0]) + [3 * f, f, 3 * f, f]
        b = np.array([150, 40, 190, 100.0]) + [-2 * f, 2 * f, -2 * f, 2 * f]
        c = np.array([100, 150, 130, 200.0]) + [f, -f, f, -f]
        boxes = np.stack([a, b, c]) + rng.normal(0, 1.5, (3, 4))
        out.append(np.c_[boxes, [0.9, 0.3 if f == 8 else 0.85, 0.8], [0, 1, 2]][: 2 if f < 4 else 3])
    return out


# Ultralytics 8.4.190's BYTETracker and BOTSORT (their default YAMLs, gmc_method none) fed _sequence() in the peers'
# venv: per frame the xyxy its `update` returns, by id (id k holds the detection k - 1)
ULTRALYTICS = {
    "bytetrack": [
        [[20.1886, 29.8018, 60.9606, 110.1573], [149.1965, 40.5424, 191.9560, 101.4206]],
        [[20.2031, 30.5568, 60.5073, 109.9354], [146.5420, 41.3955, 189.9667, 103.2804]],
        [[24.9345, 31.8370, 64.7875, 110.4584], [144.5239, 43.7134, 186.5407, 103.6946]],
        [[27.8945, 32.7291, 69.1940, 114.1771], [143.3563, 47.4808, 184.7856, 106.4820]],
        [[33.1971, 35.2844, 72.6294, 113.1240], [140.7115, 49.1141, 182.1547, 108.3769]],
        [[35.6370, 34.1332, 76.2883, 114.1522], [139.5196, 50.0079, 182.3434, 111.3724],
         [104.8543, 142.7646, 135.3419, 195.8219]],
        [[39.5927, 34.9925, 79.9526, 114.3081], [136.7013, 52.8699, 179.5556, 114.4397],
         [106.2150, 142.9775, 135.1147, 193.2432]],
        [[40.7166, 37.2533, 81.7639, 117.7223], [134.5886, 55.9793, 176.5831, 116.4014],
         [106.7346, 142.1460, 136.5871, 194.0318]],
        [[43.2775, 37.4796, 83.5989, 116.8581], [133.9504, 57.6728, 174.2150, 115.6616],
         [107.8073, 140.5542, 137.9454, 193.1158]],
        [[45.0340, 39.1825, 85.5755, 118.6950], [132.1622, 58.7409, 172.6417, 116.9873],
         [110.4143, 141.4663, 139.7922, 192.6953]],
        [[49.9976, 40.9064, 89.5291, 118.4567], [128.6049, 59.4241, 170.2048, 119.7931],
         [109.6838, 139.2464, 139.2887, 190.9165]],
        [[53.0136, 42.6634, 93.1126, 121.5017], [126.8700, 62.8558, 167.7925, 123.0640],
         [111.6358, 139.3065, 140.6224, 189.7493]],
        [[55.0801, 42.2557, 95.3446, 122.0982], [125.1204, 65.3472, 165.3531, 124.4173],
         [112.3650, 137.7057, 140.7600, 186.7393]],
        [[58.6873, 42.9720, 97.7962, 120.6660], [123.5131, 66.1480, 163.9702, 125.8554],
         [114.8875, 136.9448, 142.7001, 185.0088]],
        [[63.3867, 44.8960, 102.7605, 123.1990], [122.6095, 68.3731, 162.7836, 127.7370],
         [113.5942, 137.1273, 141.4263, 185.0387]],
    ],
    "botsort": [
        [[20.1886, 29.8018, 60.9606, 110.1573], [149.1965, 40.5424, 191.9560, 101.4206]],
        [[19.6019, 30.5568, 61.1086, 109.9354], [147.4498, 41.3955, 189.0589, 103.2804]],
        [[25.5688, 31.8370, 64.0381, 110.4584], [145.6774, 43.7134, 185.3071, 103.6946]],
        [[28.0002, 32.7291, 69.1472, 114.1771], [142.6635, 47.4808, 185.4441, 106.4820]],
        [[33.4963, 35.2844, 72.3207, 113.1240], [141.6944, 49.1141, 181.2488, 108.3769]],
        [[34.9860, 34.1332, 76.9371, 114.1522], [140.4111, 50.0079, 181.5497, 111.3724],
         [105.6890, 142.7646, 134.5072, 195.8219]],
        [[38.9670, 34.9925, 80.5450, 114.3081], [137.6003, 52.8699, 178.6835, 114.4397],
         [106.1402, 142.9775, 135.2112, 193.2432]],
        [[40.0058, 37.2533, 82.4868, 117.7223], [135.1792, 55.9793, 175.9913, 116.4014],
         [106.3493, 142.1460, 136.9490, 194.0318]],
        [[43.7433, 37.4796, 83.1549, 116.8581], [134.3044, 57.6728, 173.8550, 115.6616],
         [108.5533, 140.5542, 137.1709, 193.1158]],
        [[44.5406, 39.1825, 86.0456, 118.6950], [132.1125, 58.7409, 172.6854, 116.9873],
         [110.6594, 141.4663, 139.6308, 192.6953]],
        [[49.8045, 40.9064, 89.6628, 118.4567], [129.9773, 59.4241, 168.8518, 119.7931],
         [109.9212, 139.2464, 139.1178, 190.9165]],
        [[53.2785, 42.6634, 92.8298, 121.5017], [129.4853, 62.8558, 165.1785, 123.0640],
         [111.2412, 139.3065, 141.0412, 189.7493]],
        [[56.4133, 42.2557, 93.9911, 122.0982], [125.7152, 65.3472, 164.7482, 124.4173],
         [111.1601, 137.7057, 141.9951, 186.7393]],
        [[59.4445, 42.9720, 97.0436, 120.6660], [124.4244, 66.1480, 163.0289, 125.8554],
         [114.4247, 136.9448, 143.0766, 185.0088]],
        [[63.8139, 44.8960, 102.3445, 123.1990], [123.1058, 68.3731, 162.2890, 127.7370],
         [112.9360, 137.1273, 142.0227, 185.0387]],
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
        assert idx.tolist() == list(range(len(expected))) and ids.tolist() == [i + 1 for i in idx], f
        np.testing.assert_allclose(boxes, expected, atol=2e-4, err_msg=f"frame {f}")
        if f > 1:  # the filter's box, not the detection's
            assert np.abs(boxes - d[idx, :4]).max() > 0.1, f


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


def _turning_sequence():
    """Two oriented boxes (xywhr) moving and turning (0.15 and -0.1 rad a frame; the first through both the
    predictions' wrap at pi/2 and the canonical one at 3pi/4), jittered N(0, 1 px) and N(0, 0.03 rad) (seed 0): rows
    of x, y, w, h, conf, cls, angle as drawn. The second's score drops to 0.3 on frame 9."""
    rng = np.random.default_rng(0)
    out = []
    for f in range(15):
        a = [60 + 3 * f, 50 + f, 50, 18, 0.3 + 0.15 * f]
        b = [200 - 2 * f, 120 + 2 * f, 24, 44, 1.2 - 0.1 * f]
        boxes = np.array([a, b]) + np.c_[rng.normal(0, 1.0, (2, 4)), rng.normal(0, 0.03, 2)]
        out.append(np.c_[boxes[:, :4], [0.9, 0.3 if f == 8 else 0.85], [0, 1], boxes[:, 4]])
    return out


# Ultralytics 8.4.190's trackers (default YAMLs, gmc_method none) fed _turning_sequence() in its predict's form
# (utils.rotated.canonical: w >= h, angle in [-pi/4, 3pi/4)) in the peers' venv: per frame the xywhr its `update`
# returns for ids 1 and 2 (always both, in that order)
ULTRALYTICS_OBB = {
    "bytetrack": [
        [[60.1257, 49.8679, 50.6404, 18.1049, 0.2789], [199.4643, 120.3616, 44.9471, 25.3040, -0.4088]],
        [[62.0791, 50.8862, 49.8143, 17.8240, 0.4623], [197.1125, 121.1479, 42.1382, 23.7001, -0.4395]],
        [[65.1550, 52.8846, 50.8750, 18.2235, 0.5863], [196.8336, 123.5444, 41.4210, 23.2688, -0.5642]],
        [[67.6782, 53.0512, 51.5604, 18.4946, 0.7735], [194.6966, 125.9844, 41.4555, 23.2399, -0.6260]],
        [[70.4245, 55.0366, 52.2317, 18.7518, 0.9540], [192.6114, 127.6639, 44.3124, 24.8280, -0.7313]],
        [[74.5360, 54.4621, 52.1026, 18.7426, 1.0145], [189.4779, 130.0635, 44.0244, 24.6343, -0.8906]],
        [[77.4231, 54.9272, 50.0210, 17.9273, 1.2190], [188.1425, 131.7805, 45.2768, 25.3481, -1.0369]],
        [[80.7515, 57.0505, 49.0925, 17.5364, 1.3515], [187.3831, 132.9666, 43.2175, 24.0747, -1.0107]],
        [[83.9766, 57.5478, 47.9559, 17.0734, 1.4774], [183.6883, 136.0215, 43.9376, 24.4312, -1.1201]],
        [[86.7410, 59.8945, 48.2698, 17.1573, 1.6098], [182.1096, 138.6705, 43.6503, 24.2729, -1.3128]],
        [[90.1989, 60.9824, 47.8928, 16.9625, 1.7325], [180.6805, 139.3602, 42.6932, 23.6217, -1.3592]],
        [[92.6411, 61.4146, 50.0342, 17.7615, 1.9753], [178.7632, 141.2251, 44.7697, 24.8233, -1.4359]],
        [[96.3452, 62.6930, 48.1126, 16.9777, 2.0829], [176.2447, 143.1719, 42.4817, 23.3869, -1.6017]],
        [[98.3900, 63.4126, 52.1674, 18.5346, 2.1790], [174.1070, 146.3938, 44.8414, 24.7310, -1.6339]],
        [[101.9460, 64.4142, 51.8832, 18.4759, 2.3759], [172.2757, 147.9092, 42.1290, 23.0448, -1.7384]],
    ],
    "botsort": [
        [[60.1257, 49.8679, 50.6404, 18.1049, 0.2789], [199.4643, 120.3616, 44.9471, 25.3040, -0.4088]],
        [[62.0791, 50.8862, 48.0671, 17.8240, 0.4623], [197.1125, 121.1479, 43.8508, 23.7001, -0.4395]],
        [[65.1944, 52.8846, 48.9522, 18.2235, 0.5863], [196.8289, 123.5444, 43.1869, 23.2688, -0.5642]],
        [[67.7045, 53.0512, 49.6355, 18.4946, 0.7735], [194.7084, 125.9844, 43.6171, 23.2399, -0.6260]],
        [[70.4440, 55.0366, 50.9601, 18.7518, 0.9540], [192.6313, 127.6639, 45.3145, 24.8280, -0.7313]],
        [[74.5442, 54.4621, 50.4436, 18.7426, 1.0145], [189.4769, 130.0635, 44.9959, 24.6343, -0.8906]],
        [[77.4337, 54.9272, 51.4449, 17.9273, 1.2190], [188.1486, 131.7805, 45.2929, 25.3481, -1.0369]],
        [[80.7420, 57.0505, 51.2875, 17.5364, 1.3515], [187.4005, 132.9666, 45.1250, 24.0747, -1.0107]],
        [[83.9666, 57.5478, 50.2694, 17.0734, 1.4774], [183.7349, 136.0215, 45.2966, 24.4312, -1.1201]],
        [[86.7387, 59.8945, 49.8372, 17.1573, 1.6098], [182.1334, 138.6705, 44.0859, 24.2729, -1.3128]],
        [[90.1958, 60.9824, 49.8549, 16.9625, 1.7325], [180.6972, 139.3602, 44.4420, 23.6217, -1.3592]],
        [[92.6441, 61.4146, 49.9186, 17.7615, 1.9753], [178.7758, 141.2251, 44.6421, 24.8233, -1.4359]],
        [[96.3567, 62.6930, 50.0412, 16.9777, 2.0829], [176.2427, 143.1719, 44.4040, 23.3869, -1.6017]],
        [[98.4106, 63.4126, 50.2734, 18.5346, 2.1790], [174.1137, 146.3938, 44.9072, 24.7310, -1.6339]],
        [[101.9751, 64.4142, 50.3663, 18.4759, 2.3759], [172.2822, 147.9092, 44.2600, 23.0448, -1.7384]],
    ],
}


@pytest.mark.parametrize("name", ["bytetrack", "botsort"])
def test_oriented_tracks_boxes_are_ultralytics_given_our_predictions_form(name):
    """Ours fed the same boxes regularised (angle in [0, pi/2), sides swapped where that turned them), as our predict
    reports them: the same track boxes, the angle the same modulo pi (the same rectangle)."""
    t = make_tracker(_config(name), rotated=True)
    for f, (d, expected) in enumerate(zip(_turning_sequence(), ULTRALYTICS_OBB[name]), 1):
        reported = regularize(torch.from_numpy(np.c_[d[:, :4], d[:, 6]])).numpy()
        idx, ids, boxes = t.update(reported, d[:, 4], d[:, 5])
        assert idx.tolist() == [0, 1] and ids.tolist() == [1, 2], f
        expected = np.array(expected)
        np.testing.assert_allclose(boxes[:, :4], expected[:, :4], atol=2e-4, err_msg=f"frame {f}")
        turn = np.array([math.remainder(a, math.pi) for a in boxes[:, 4] - expected[:, 4]])
        np.testing.assert_allclose(turn, 0, atol=2e-4, err_msg=f"frame {f}")
