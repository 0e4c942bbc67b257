"""evaluation/coco.py: class-id map, result export, RLE, annotation JSON from YOLO labels, pycocotools evaluation."""

import builtins
import json

import numpy as np
import pytest
import torch

from evaluation import coco
from evaluation.coco import (
    box_to_coco_json,
    eval_coco_json,
    image_id_from_path,
    labels_to_coco_json,
    masks_to_rle,
)

mask_utils = pytest.importorskip("pycocotools.mask")


def test_image_id_from_path():
    assert image_id_from_path("/coco/images/val2017/000000397133.jpg") == 397133
    assert image_id_from_path("a/b/frame_01.png") == "frame_01"


def test_box_to_coco_json_by_hand():
    predn = torch.tensor([[10.12345, 20.5, 30.0, 60.25, 0.876543, 2.0], [0.0, 0.0, 5.0, 5.0, 0.5, 0.0]])
    out = box_to_coco_json(predn, 42, class_map=[1, 2, 3])
    assert out[0] == {"image_id": 42, "category_id": 3, "bbox": [10.123, 20.5, 19.877, 39.75], "score": 0.87654}
    assert out[1]["category_id"] == 1 and out[1]["bbox"] == [0.0, 0.0, 5.0, 5.0]
    assert box_to_coco_json(predn, "img", class_map=None)[0]["category_id"] == 2
    json.dumps(box_to_coco_json(predn, 1))  # all plain Python types


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pycocotools' decode under numpy 2
def test_masks_to_rle_round_trip():
    rng = np.random.default_rng(0)
    masks = rng.random((3, 7, 9)) > 0.5
    rles = masks_to_rle(torch.from_numpy(masks))
    assert all(isinstance(r["counts"], str) and r["size"] == [7, 9] for r in rles)
    back = np.stack([mask_utils.decode({"size": r["size"], "counts": r["counts"].encode()}) for r in rles])
    np.testing.assert_array_equal(back, masks)
    assert masks_to_rle(np.zeros((0, 7, 9), bool)) == []


def test_missing_pycocotools_message(monkeypatch):
    real_import = builtins.__import__

    def no_pycocotools(name, *args, **kwargs):
        if name.startswith("pycocotools"):
            raise ImportError("No module named 'pycocotools'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pycocotools)
    with pytest.raises(ImportError, match="pip install pycocotools"):
        coco.masks_to_rle(np.ones((1, 2, 2), bool))
    with pytest.raises(ImportError, match="pip install pycocotools"):
        eval_coco_json({}, [{"image_id": 1}])


def _labels():
    square = np.array([[0.1, 0.1], [0.5, 0.1], [0.5, 0.5], [0.1, 0.5]])
    mask = np.zeros((50, 100), bool)
    mask[10:20, 30:70] = True
    return [
        {
            "im_file": "/d/images/7.jpg",
            "shape": (50, 100),  # h, w
            "cls": np.array([[0.0], [2.0]]),
            "bboxes": np.array([[0.3, 0.3, 0.4, 0.4], [0.5, 0.3, 0.4, 0.2]]),
            "segments": [square, None],
        },
        {"im_file": "/d/images/x.jpg", "shape": (50, 100), "cls": np.array([[1.0]]),
         "bboxes": np.array([[0.5, 0.3, 0.4, 0.2]]), "masks": mask[None]},  # fmt: skip
        {"im_file": "/d/images/empty.jpg", "shape": (30, 40), "cls": np.zeros((0, 1)), "bboxes": np.zeros((0, 4))},
    ]


def test_labels_to_coco_json_structure():
    anno = labels_to_coco_json(_labels(), {0: "a", 1: "b", 2: "c"})
    assert [im["id"] for im in anno["images"]] == [7, "x", "empty"]
    assert anno["images"][0] == {"id": 7, "width": 100, "height": 50, "file_name": "7.jpg"}
    a0, a1, a2 = anno["annotations"]
    assert [a["id"] for a in anno["annotations"]] == [1, 2, 3]
    assert a0["bbox"] == pytest.approx([10, 5, 40, 20]) and a0["iscrowd"] == 0
    assert a0["segmentation"] == [pytest.approx([10, 5, 50, 5, 50, 25, 10, 25])]
    assert a0["area"] == pytest.approx(40 * 20)  # polygon area, pixels
    assert "segmentation" not in a1 and a1["area"] == pytest.approx(40 * 10) and a1["category_id"] == 2
    assert a2["image_id"] == "x" and a2["area"] == 400 and isinstance(a2["segmentation"]["counts"], str)
    assert anno["categories"] == [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}, {"id": 2, "name": "c"}]
    mapped = labels_to_coco_json(_labels(), ["a", "b", "c"], class_map=[5, 6, 7])
    assert [a["category_id"] for a in mapped["annotations"]] == [5, 7, 6]
    json.dumps(anno)


def test_labels_to_coco_json_accepts_a_dataset():
    class Dataset:
        labels = _labels()

    assert labels_to_coco_json(Dataset(), ["a", "b", "c"]) == labels_to_coco_json(_labels(), ["a", "b", "c"])


def _perfect_results(anno):
    out = []
    for a in anno["annotations"]:
        x, y, w, h = a["bbox"]
        out += box_to_coco_json(np.array([[x, y, x + w, y + h, 0.9, a["category_id"]]]), a["image_id"])
    return out


def test_eval_coco_json_perfect_empty_and_files(tmp_path):
    anno = labels_to_coco_json(_labels(), ["a", "b", "c"])
    res = _perfect_results(anno)
    assert eval_coco_json(anno, res) == pytest.approx((1.0, 1.0))
    assert eval_coco_json(anno, []) == (0.0, 0.0)
    anno_f, res_f = tmp_path / "anno.json", tmp_path / "pred.json"
    anno_f.write_text(json.dumps(anno))
    res_f.write_text(json.dumps(res[:2]))  # class 1 (image 'x') missed
    m, m50 = eval_coco_json(anno_f, res_f)
    assert m == pytest.approx(2 / 3) and m50 == pytest.approx(2 / 3)
    assert eval_coco_json(anno_f, str(res_f), img_ids=[7]) == pytest.approx((1.0, 1.0))  # only image 7 counted
    assert res[0].get("area") is None, "the caller's result dicts are left untouched"


def test_eval_coco_json_segm():
    labels = _labels()[1:2]
    anno = labels_to_coco_json(labels, ["a", "b"])
    mask = labels[0]["masks"]
    half = mask.copy()
    half[:, :, 50:] = False  # IoU 0.5 with the truth
    pred = np.array([[30, 10, 70, 20, 0.9, 1], [30, 10, 50, 20, 0.8, 1]], dtype=float)
    res = [{**box_to_coco_json(pred[:1], "x")[0], "segmentation": masks_to_rle(mask)[0]}]
    assert eval_coco_json(anno, res, iou_type="segm") == pytest.approx((1.0, 1.0))
    res = [{**box_to_coco_json(pred[1:], "x")[0], "segmentation": masks_to_rle(half)[0]}]
    m, m50 = eval_coco_json(anno, res, iou_type="segm")
    assert m50 == pytest.approx(1.0) and m == pytest.approx(0.1)  # matched only at the 0.50 threshold
