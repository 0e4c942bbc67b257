"""One of our detection checkpoints as an Ultralytics .pt, for fine-tuning both tools from the same weights
(`benchmarks/study.py --peer-weights`). Runs with the peers' interpreter, where ultralytics is installed:

    /tmp/peers-venv/bin/python -m benchmarks.to_ultralytics runs/train/exp/weights/best.pt yolov8n.yaml start.pt

Our state-dict keys and shapes are the official ones (docs/design.md), so the weights load by key into Ultralytics'
own model built from the same cfg; the script refuses a checkpoint where any key is missing, extra or of
another shape. Our file is read by our one checkpoint loader (models/checkpoints.py); the .pt written holds the
Ultralytics model object, as Ultralytics' own files do.
"""

import argparse

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="our best.pt / last.pt")
    p.add_argument("cfg", help="the model YAML it was trained from, e.g. yolov8n.yaml")
    p.add_argument("out", help="the Ultralytics .pt to write")
    opt = p.parse_args()
    from ultralytics.nn.tasks import DetectionModel

    from models.checkpoints import load_checkpoint

    ckpt = load_checkpoint(opt.checkpoint)
    entry = ckpt.get("ema") or ckpt["model"]
    state, names = entry["state_dict"], entry["names"]
    model = DetectionModel(opt.cfg, nc=len(names), verbose=False)
    theirs = model.state_dict()
    wrong = sorted(set(theirs) ^ set(state)) + [k for k in theirs if k in state and theirs[k].shape != state[k].shape]
    if wrong:
        raise SystemExit(f"error: {opt.checkpoint} does not match Ultralytics' {opt.cfg}: {wrong[:5]} "
                         f"({len(wrong)} keys)")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    model.names = dict(names)
    torch.save({"model": model.half(), "train_args": {"model": opt.cfg}, "date": None, "version": None}, opt.out)
    print(f"{opt.out}: {len(state)} tensors from {opt.checkpoint}, classes {list(model.names.values())}")


if __name__ == "__main__":
    main()
