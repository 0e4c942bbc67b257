"""The predictor walks its task's fields (evaluation/fields.py): a made-up model output for an image 200 wide and 100
high letterboxed to a 64 x 48 input (gain 0.32, 8 px of padding above and below), through `postprocess` and
`write_result`, against coordinates, lines and pixels worked out by hand."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import torch

import detect
from engine.options import DetectPredictOptions, PoseValOptions
from engine.predictor import conf_default
from engine.tasks import TASKS
from evaluation.fields import Boxes, ClassScores, Field, Keypoints, Masks, Predictions
from evaluation.plots import colors
from utils import ops
from utils.ops import OutputLayout

DetectionPredictor = TASKS["detect"].predictor
PoseValidator = TASKS["pose"].validator

IM0 = (100, 200, 3)
INPUT = torch.zeros(1, 3, 48, 64)


def _predictor(fields, layout, *argv):
    p = object.__new__(DetectionPredictor)  # no weights to load: the model is the output handed to postprocess
    opt = DetectPredictOptions.from_values(detect.parse_opt(list(argv)))
    p.args = dataclasses.replace(opt, **conf_default(opt))  # what __init__ settles
    p.model, p.names, p.fields = SimpleNamespace(output_layout=layout), {0: "a", 1: "b"}, fields
    return p


def _row(cx, cy, w, h, scores, *extra):
    return [cx, cy, w, h, *scores, *extra]


def test_pose_record_lines_and_drawing(tmp_path):
    """Two objects: box (30, 30)-(70, 70) of class 0 at 0.8 with keypoints (50, 50) and (70, 50), the second on the
    box's right edge; box (140, 40)-(160, 60) of class 1 at 0.6. Lines most confident first, as val writes them; the
    box drawn over the keypoints."""
    p = _predictor((Boxes(), Keypoints((2, 3))), OutputLayout(2, kpt_shape=(2, 3)), "--save-conf",
                   "--line-thickness", "3")
    pred = torch.tensor([[_row(16, 24, 12.8, 12.8, (0.8, 0.1), 16, 24, 0.9, 22.4, 24, 0.7),
                          _row(48, 24, 6.4, 6.4, (0.2, 0.6), 48, 24, 0.95, 0, 0, 0)]])
    image = p.postprocess(pred, INPUT, np.zeros(IM0, np.uint8))
    # the second object's keypoint 1, (0, -25), clipped to the image
    assert torch.allclose(image.boxes, torch.tensor([[30, 30, 70, 70, 0.8, 0, 50, 50, 0.9, 70, 50, 0.7],
                                                     [140, 40, 160, 60, 0.6, 1, 150, 50, 0.95, 0, 0, 0]]))
    im0 = np.zeros(IM0, np.uint8)
    txt = tmp_path / "labels" / "x.txt"
    txt.parent.mkdir()
    assert p.write_result(image, im0, txt) == "1 b, 1 a"  # the classes in the order drawn
    lines = ["0 0.25 0.5 0.2 0.4 0.25 0.5 0.9 0.35 0.5 0.7 0.8\n", "1 0.75 0.5 0.1 0.2 0.75 0.5 0.95 0 0 0 0.6\n"]
    assert txt.read_text() == "".join(lines)
    assert tuple(im0[50, 50]) == colors(0, bgr=True)  # keypoint 0 of the first object
    assert tuple(im0[50, 70]) == tuple(im0[45, 70]) == colors(0, bgr=True) != colors(1, bgr=True)  # keypoint 1
    # under the box's edge
    assert tuple(im0[45, 160]) == colors(1, bgr=True) and not im0[45, 165].any()  # the second box's right edge
    # val.py writes the same line for the same rows
    v = PoseValidator(PoseValOptions(imgsz=64, kpt_shape=(2, 3)), tmp_path, p.names)
    v.init_metrics(p.model)
    v.save_txt(image.boxes, IM0[:2], tmp_path / "val.txt")
    assert (tmp_path / "val.txt").read_text() == "".join(lines)


def _segment():
    return _predictor((Boxes(), Masks()), OutputLayout(2, nm=1, proto=(1,)))


def test_segment_masks_at_the_image_size_and_polygon_lines(tmp_path):
    """Prototypes positive everywhere: the mask is its box, (8, 16)-(24, 32) in the input, (25, 25)-(75, 75) in the
    image; the line is its outline, without the box."""
    p = _segment()
    pred = torch.tensor([[_row(16, 24, 16, 16, (0.2, 0.9), 1.0)]])
    image = p.postprocess((pred, torch.ones(1, 1, 12, 16)), INPUT, np.zeros(IM0, np.uint8))
    assert torch.allclose(image.boxes[:, :4], torch.tensor([[25.0, 25, 75, 75]]))
    assert image.masks.shape == (1, 100, 200) and image.masks.dtype == torch.bool
    ys, xs = np.nonzero(image.masks[0].numpy())
    assert (xs.min(), xs.max(), ys.min(), ys.max()) == (25, 74, 25, 74)
    im0 = np.zeros(IM0, np.uint8)
    txt = tmp_path / "x.txt"
    assert p.write_result(image, im0, txt) == "1 b"
    c, *xy = txt.read_text().split()
    corners = np.array(xy, float).reshape(-1, 2) * (200, 100)
    on_edge = np.isin(corners, (25, 74)).any(1)
    assert c == "1" and on_edge.all() and corners.min(0).tolist() == [25, 25] and corners.max(0).tolist() == [74, 74]
    assert tuple(im0[50, 50]) == tuple(round(v * 0.5) for v in colors(1, bgr=True))  # mask blended at alpha 0.5


def test_nothing_predicted_writes_no_line(tmp_path):
    p = _segment()
    image = p.postprocess((torch.zeros(1, 5, 7), torch.ones(1, 1, 12, 16)), INPUT, np.zeros(IM0, np.uint8))
    assert image.boxes.shape == (0, 7) and image.masks.shape == (0, 100, 200)
    im0 = np.zeros(IM0, np.uint8)
    assert p.write_result(image, im0, tmp_path / "x.txt") == "(no detections)"
    assert not (tmp_path / "x.txt").exists() and not im0.any()


def test_class_scores_lines_summary_and_the_whole_image_object():
    scores, image = ClassScores({0: "a", 1: "b", 2: "c"}), Predictions(probs=torch.tensor([0.2, 0.5, 0.3]))
    assert scores.lines((scores,), image, IM0[:2], False) == ["0.50 b\n", "0.30 c\n", "0.20 a\n"]
    assert scores.summary(image, scores.names) == "b 0.50, c 0.30, a 0.20"
    assert scores.objects(image) == [(None, 1, 0.5)]
    record = ClassScores.match(torch.tensor([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]), {"cls": torch.tensor([2, 1])})
    assert record["pred"][0].tolist() == [[2, 1, 0], [0, 1, 2]]


def test_a_mask_without_an_outline_has_no_line(tmp_path):
    """Two objects, the second's mask coefficient negative (an empty mask): one line, the first object's."""
    p = _segment()
    pred = torch.tensor([[_row(16, 24, 16, 16, (0.2, 0.9), 1.0), _row(48, 24, 16, 16, (0.8, 0.1), -1.0)]])
    image = p.postprocess((pred, torch.ones(1, 1, 12, 16)), INPUT, np.zeros(IM0, np.uint8))
    assert image.masks.sum((1, 2)).tolist()[1] == 0
    p.write_result(image, np.zeros(IM0, np.uint8), tmp_path / "x.txt")
    assert [line.split()[0] for line in (tmp_path / "x.txt").read_text().splitlines()] == ["1"]


class Centres(Field):
    """A field of the test's own: one point per object (the rows' last two columns), scaled back, written after the
    box and drawn as a dot, as a new task would add it, without a predictor of its own."""

    def scale(self, native, fit):
        ops.scale_coords(fit.input, native[:, -2:], fit.shape, ratio_pad=fit.ratio_pad)

    def txt_columns(self, native, shape):
        return native[:, -2:] / torch.tensor([shape[1], shape[0]])

    def draw(self, annotator, image, label):
        for xy in image.boxes[:, -2:]:
            annotator.keypoints(xy[None])


def test_a_field_of_one_s_own_plugs_into_the_predictor(tmp_path):
    p = _predictor((Boxes(), Centres()), OutputLayout(2, kpt_shape=(1, 2)))
    pred = torch.tensor([[_row(16, 24, 12.8, 12.8, (0.8, 0.1), 16, 24)]])
    image = p.postprocess(pred, INPUT, np.zeros(IM0, np.uint8))
    im0 = np.zeros(IM0, np.uint8)
    p.write_result(image, im0, tmp_path / "x.txt")
    assert (tmp_path / "x.txt").read_text() == "0 0.25 0.5 0.2 0.4 0.25 0.5\n"
    assert tuple(im0[50, 50]) == colors(0, bgr=True)
