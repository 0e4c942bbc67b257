"""benchmarks/scale_val.py: the synthetic outputs hold what was drawn, our side runs on them, and the AP rule it
compares Ultralytics' by agrees with ours wherever the two rules must."""

import numpy as np

from benchmarks import scale_val
from evaluation.metrics import ap_per_class


def test_the_dense_outputs_hold_each_candidate_and_nothing_else(tmp_path):
    """Every stored (candidate, class, score) is at its anchor of its image, with the candidate's box; no other
    score is set."""
    path = scale_val.make(40, tmp_path / "d.npz", seed=1)
    data = scale_val.Data(path)
    z, off = data.z, data.off
    out = data.output(32, 40)  # the second batch: offsets into the arrays must be right
    for b, i in enumerate(range(32, 40)):
        anchors = z["anchor"][off[i, 1]:off[i + 1, 1]]
        assert np.array_equal(out[b][:4, anchors].T, z["xywh"][off[i, 1]:off[i + 1, 1]])
        pairs = slice(off[i, 2], off[i + 1, 2])
        scores = out[b, 4 + z["pair_cls"][pairs], anchors[z["pair_cand"][pairs]]]
        assert np.array_equal(scores, z["pair_score"][pairs])
        assert (out[b, 4:] > 0).sum() == off[i + 1, 2] - off[i, 2]
    rows, ratio_pad, shapes = data.labels(32, 40)
    assert len(rows) == off[40, 0] - off[32, 0] and rows[:, 0].max() <= 7 and (rows[:, 2:] <= 1).all()


def test_our_side_runs_and_keeps_what_its_mAP_came_from(tmp_path):
    path = scale_val.make(40, tmp_path / "d.npz", seed=2)
    totals, result = scale_val.run_ours(scale_val.Data(path), tmp_path, None, tmp_path / "stats.npz")
    stats = np.load(tmp_path / "stats.npz")
    assert result["rows"][0] == len(stats["conf"]) > 40 * 50  # most images keep dozens of detections
    ap = ap_per_class(stats["tp"], stats["conf"], stats["pred_cls"], stats["target_cls"])[3]
    assert abs(result["map"] - ap.mean()) < 1e-12
    assert all(totals[k][0] > 0 for k in ("nms", "match", "map", "json")) and (tmp_path / "predictions.json").exists()


def test_ap_to_the_last_recall_is_ours_where_recall_reaches_one_and_below_it_elsewhere():
    """With every label found the two rules are one curve; with labels left, ours holds the last precision on to
    recall 1 and the other drops to 0 there: here one of two labels found at precision 1 gives about 0.5 against
    ours' about 0.75."""
    tp = np.array([[True], [False], [True]])
    conf, pred_cls = np.array([0.9, 0.8, 0.7]), np.zeros(3)
    ours = ap_per_class(tp, conf, pred_cls, np.zeros(2))[3].mean()
    assert scale_val.ap_to_last_recall(tp, conf, pred_cls, np.zeros(2)) == ours
    half = scale_val.ap_to_last_recall(tp[:1], conf[:1], pred_cls[:1], np.zeros(2))
    assert abs(half - 0.5) < 0.01
    assert abs(ap_per_class(tp[:1], conf[:1], pred_cls[:1], np.zeros(2))[3][0, 0] - 0.75) < 0.01
