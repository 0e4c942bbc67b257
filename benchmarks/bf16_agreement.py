"""Does bfloat16 inference keep a model's detections? Runs detect.py's predictor over a folder twice, fp32 and
`--amp bf16`, and matches each image's boxes: a box is kept when the other run has a box of the same class at
IoU >= --iou (0.95). Prints, per weights file, the share of fp32 boxes kept by bf16 and of bf16 boxes found in fp32,
the largest confidence change of a kept box, and for each box not kept its confidence and its best IoU with a box of
the other run (near the confidence threshold, a box may cross it either way). With --data, it also validates each
file on the dataset's val split twice, fp32 and under bf16 autocast (as training's per-epoch validation runs under
--amp bf16), and prints both mAPs. Figures, not assertions.

    python -m benchmarks.bf16_agreement --weights runs/train/exp/weights/best.pt --source /tmp/shapes/images/val \
        --data /tmp/shapes/shapes-det.yaml
"""

import argparse

import torch

from engine.options import DetectPredictOptions
from engine.tasks import TASKS
from engine.validator import ValOptions
from models.checkpoints import attempt_load
from utils.cli import predict_parser
from utils.ops import box_iou

DetectionPredictor, DetectionValidator = TASKS["detect"].predictor, TASKS["detect"].validator


def predictions(weights, source, imgsz, amp):
    parser = predict_parser(DetectPredictOptions, "detect.py's options", weights, imgsz, "runs/bf16_agreement")
    opt = parser.parse_args(["--source", source, "--device", "cpu", "--nosave", "--amp", amp, "--exist-ok"])
    return DetectionPredictor(opt)()


def val_maps(weights, data, imgsz):
    """(mAP50, mAP50-95) of the weights on data's val split, fp32 then bf16 autocast."""
    model = attempt_load(weights, device=torch.device("cpu"), fuse=False).float()
    model = model.to(memory_format=torch.channels_last)
    options = ValOptions(imgsz=imgsz, batch=32, workers=0, plots=False)
    d = DetectionValidator.get_data(data, options)
    validator = DetectionValidator(options, "runs/bf16_agreement", d["names"])  # reusable, as in training
    validator.build_dataloader(d["val"], int(max(model.stride)))
    out = []
    for amp_dtype in (None, torch.bfloat16):
        stats = validator(model, amp_dtype=amp_dtype)
        out.append((stats["metrics/mAP50(B)"], stats["metrics/mAP50-95(B)"]))
    return out


def matched(a, b, iou):
    """For each box of a (n, 6: xyxy, conf, cls): the index of a same-class box of b at IoU >= iou, or -1, and the
    best same-class IoU it has in b."""
    if not len(a) or not len(b):
        return torch.full((len(a),), -1, dtype=torch.long), torch.zeros(len(a))
    ious = box_iou(a[:, :4], b[:, :4]) * (a[:, 5:6] == b[:, 5].unsqueeze(0))
    best, idx = ious.max(1)
    return torch.where(best >= iou, idx, torch.full_like(idx, -1)), best


def compare(fp32, bf16, iou):
    kept = found = n_fp32 = n_bf16 = 0
    dconf, lost = 0.0, []
    for a, b in zip(fp32, bf16):
        (m_ab, iou_ab), (m_ba, iou_ba) = matched(a, b, iou), matched(b, a, iou)
        n_fp32, n_bf16 = n_fp32 + len(a), n_bf16 + len(b)
        kept, found = kept + int((m_ab >= 0).sum()), found + int((m_ba >= 0).sum())
        if (m_ab >= 0).any():
            dconf = max(dconf, float((a[m_ab >= 0, 4] - b[m_ab[m_ab >= 0], 4]).abs().max()))
        lost += [f"fp32 {c:.3f}/{u:.2f}" for c, u in zip(a[m_ab < 0, 4].tolist(), iou_ab[m_ab < 0].tolist())]
        lost += [f"bf16 {c:.3f}/{u:.2f}" for c, u in zip(b[m_ba < 0, 4].tolist(), iou_ba[m_ba < 0].tolist())]
    return kept / max(n_fp32, 1), found / max(n_bf16, 1), n_fp32, n_bf16, dconf, lost


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", nargs="+", required=True)
    p.add_argument("--source", required=True, help="image folder, e.g. the shapes val images")
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--iou", type=float, default=0.95)
    p.add_argument("--data", help="dataset YAML: also compare fp32 and bf16 validation mAP on its val split")
    opt = p.parse_args()
    print(f"{'weights':<48}{'fp32 kept':>10}{'bf16 found':>11}{'boxes':>12}{'max dconf':>10}  not kept (conf/best IoU)")
    for w in opt.weights:
        kept, found, n32, n16, dconf, lost = compare(predictions(w, opt.source, opt.img, "off"),
                                                     predictions(w, opt.source, opt.img, "bf16"), opt.iou)
        print(f"{w[-48:]:<48}{kept:>10.4f}{found:>11.4f}{f'{n32}/{n16}':>12}{dconf:>10.4f}  {', '.join(lost[:8])}")
    for w in opt.weights if opt.data else ():
        (a50, a), (b50, b) = val_maps(w, opt.data, opt.img)
        print(f"{w[-48:]}: val mAP50 / mAP50-95 fp32 {a50:.4f} / {a:.4f}, bf16 {b50:.4f} / {b:.4f}")


if __name__ == "__main__":
    main()
