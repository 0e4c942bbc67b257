"""HOTA as the tracker benchmarks report it (benchmarks/track_synthetic.py's `hota`, TrackEval's metric), on
sequences small enough to score by hand from the definition (Luiten et al. 2020): at each IoU threshold alpha of
0.05, 0.10, .., 0.95, DetA = |TP| / (|TP| + |FN| + |FP|), AssA = the mean over TPs c of
|TPA(c)| / (|TPA(c)| + |FNA(c)| + |FPA(c)|), HOTA_alpha = sqrt(DetA * AssA); HOTA is the mean over the 19 alphas."""

import numpy as np
import pytest

from benchmarks.track_synthetic import hota, summary

pytest.importorskip("trackeval")


def _frames(gt, hyp, iou):
    """One object pair per frame: truth ids `gt[t]`, hypothesis ids `hyp[t]`, `iou` between every pair."""
    return [(np.array(g, float), np.array(h, float), np.full((len(g), len(h)), iou)) for g, h in zip(gt, hyp)]


def test_perfect_tracking_is_one():
    frames = _frames([[7]] * 5, [[3]] * 5, 1.0)
    assert hota(frames) == pytest.approx({"HOTA": 1.0, "DetA": 1.0, "AssA": 1.0})


def test_an_id_switch_halves_assa_and_leaves_deta():
    """One object over 4 frames, found each time, its track's id 1 then 2: every TP's id agrees with 2 of the
    object's 4 TPs and with none else, so AssA = 2 / (2 + 2 + 0) = 1/2 at every alpha and HOTA = sqrt(1/2)."""
    frames = _frames([[0]] * 4, [[1], [1], [2], [2]], 1.0)
    assert hota(frames) == pytest.approx({"HOTA": 0.5 ** 0.5, "DetA": 1.0, "AssA": 0.5})


def test_a_missed_object_lowers_deta_only():
    """Two objects, one of them never found: 4 TP and 4 FN, so DetA = 1/2, AssA = 1."""
    frames = [(np.array([0.0, 1.0]), np.array([5.0]), np.array([[1.0], [0.0]])) for _ in range(4)]
    assert hota(frames) == pytest.approx({"HOTA": 0.5 ** 0.5, "DetA": 0.5, "AssA": 1.0})


def test_localisation_counts_the_thresholds_a_match_passes():
    """Every match at IoU 0.62: a TP at the 12 alphas 0.05..0.60, else an FN and an FP (DetA 0, AssA 0)."""
    frames = _frames([[0]] * 3, [[9]] * 3, 0.62)
    assert hota(frames) == pytest.approx({"HOTA": 12 / 19, "DetA": 12 / 19, "AssA": 12 / 19})


def test_the_summary_holds_hota_beside_mota_and_idf1():
    pytest.importorskip("motmetrics")
    switch = _frames([[0]] * 4, [[1], [1], [2], [2]], 1.0)
    table = summary({"perfect": _frames([[0]] * 4, [[1]] * 4, 1.0), "switch": switch})
    assert list(table["hota"]) == pytest.approx([1.0, 0.5 ** 0.5]) and list(table["mota"]) == pytest.approx([1, 0.75])
    assert list(table["idf1"]) == pytest.approx([1.0, 0.5])
