#!/usr/bin/env bash
# GPU acceptance: the CUDA paths that CI (CPU only) cannot run, in one command, with one summary table.
#
#   bash benchmarks/gpu_check.sh              # on a CUDA machine: device 0, fp16 AMP, NCCL, --half, 640 px
#   DEVICE=cpu bash benchmarks/gpu_check.sh   # the same steps on CPU (bf16, gloo, no --half): checks the script
#   BUDGET=240 STEP_TIMEOUT=100 bash benchmarks/gpu_check.sh   # no step starts after 240 s; each is cut at 100 s
#
# Every step runs even if an earlier one failed; the exit status is non-zero if any failed. Outputs go under
# $OUT (set by the device tool) or runs/gpu_check. The steps' own limits bound the whole run: a `timeout` around
# this script would wait for the step in progress anyway (bash handles the signal after its foreground command).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# PYTHON=python3 where `python` is not the interpreter that has torch (images that ship only python3)
export PYTHON=${PYTHON:-python}
python() { command "$PYTHON" "$@"; }
export -f python

DEVICE=${DEVICE:-0}
OUT=${OUT:-runs/gpu_check}
if [ "$DEVICE" = cpu ]; then
    AMP=bf16; HALF=""; IMG=${IMG:-128}; BATCH=${BATCH:-8}; EPOCHS=1; RIMG=128
else
    AMP=fp16; HALF=--half; IMG=${IMG:-640}; BATCH=${BATCH:-64}; EPOCHS=1; RIMG=320
fi
P="$OUT/runs"
mkdir -p "$OUT"
SUMMARY=()
FAILED=0

step() {  # step NAME COMMAND...: run (a command at most STEP_TIMEOUT s), time, record; output to $OUT/NAME.log
    local name=$1; shift
    local t0=$SECONDS limit=()
    if [ "${BUDGET:-0}" -gt 0 ] && [ "$SECONDS" -ge "$BUDGET" ]; then
        FAILED=1
        SUMMARY+=("$(printf '%-22s %-6s %6ss  (not started: BUDGET %ss spent)' "$name" SKIPPED 0 "$BUDGET")")
        return
    fi
    declare -F "$1" >/dev/null || limit=(timeout -k 5 "${STEP_TIMEOUT:-300}" bash -c '"$@"' step)
    echo "=== $name: $*"
    if "${limit[@]}" "$@" >"$OUT/$name.log" 2>&1; then
        SUMMARY+=("$(printf '%-22s %-6s %6ss' "$name" ok $((SECONDS - t0)))")
    else
        FAILED=1
        SUMMARY+=("$(printf '%-22s %-6s %6ss  (see %s)' "$name" FAILED $((SECONDS - t0)) "$OUT/$name.log")")
        tail -20 "$OUT/$name.log"
    fi
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

COMMON=(--device "$DEVICE" --img "$IMG" --batch-size "$BATCH" --epochs "$EPOCHS" --project "$P" --exist-ok)
# the colour tables a training batch leaves to the GPU give the pixels the CPU gives (the CPU form is tested on CI)
step hsv-on-device python -c "import sys, numpy as np, torch; from utils.data import augment as A; \
from utils.dist import select_device; dev = select_device(sys.argv[1]); rng = np.random.default_rng(0); \
x = torch.from_numpy(rng.integers(0, 256, (8, 3, 160, 224))).float() / 255; \
t = torch.from_numpy(np.stack([A.hsv_tables(A.hsv_gains(0.015, 0.7, 0.4, rng)) for _ in x])); \
d = (A.apply_hsv_batch(x, t) - A.apply_hsv_batch(x.to(dev), t.to(dev)).cpu()).abs().max().item() * 255; \
print('max difference', d, 'grey levels'); assert d < 0.5" "$DEVICE"
step train-amp-v8 python train.py --cfg yolov8n.yaml --amp "$AMP" --name v8 "${COMMON[@]}"
step train-amp-v5 python train.py --cfg yolov5n.yaml --amp "$AMP" --name v5 "${COMMON[@]}"
step train-seg python segment/train.py --cfg yolov8n-seg.yaml --amp "$AMP" --name seg "${COMMON[@]}"
step train-pose python pose/train.py --cfg yolov8n-pose.yaml --amp "$AMP" --name pose "${COMMON[@]}"
step val-pose-half python pose/val.py --weights "$P/pose/weights/best.pt" --device "$DEVICE" --img "$IMG" $HALF \
    --project "$P" --name val-pose --exist-ok
step train-cls python classify/train.py --amp "$AMP" --name cls --device "$DEVICE" --img 96 \
    --batch-size "$BATCH" --epochs 1 --project "$P" --exist-ok
step torchrun-syncbn python -m torch.distributed.run --nproc_per_node 1 --master_port 29517 train.py \
    --cfg yolov5n.yaml --sync-bn --name ddp "${COMMON[@]}"
W="$P/v8/weights/best.pt"
step val-half python val.py --weights "$W" --device "$DEVICE" --img "$IMG" $HALF --project "$P" --name val --exist-ok
step detect-half python detect.py --weights "$W" --device "$DEVICE" --img "$IMG" $HALF --project "$P" --name det \
    --exist-ok
step export python export.py --weights "$W" --device "$DEVICE" --img "$IMG" --include torchscript onnx $HALF
E="$P/v8/weights/best"
step detect-onnx python detect.py --weights "$E.onnx" --device "$DEVICE" --img "$IMG" --project "$P" --name det-onnx \
    --exist-ok
step detect-torchscript python detect.py --weights "$E.torchscript" --device "$DEVICE" --img "$IMG" --project "$P" \
    --name det-ts --exist-ok

# resume: a 3-epoch run killed (SIGKILL) once its first last.pt is written, then continued from a copy of that
# checkpoint on this device and on the CPU
resume_prepare() {
    rm -rf "$P/res" "$P/res-cpu"
    python train.py --cfg yolov8n.yaml --name res --device "$DEVICE" --img "$RIMG" --batch-size 16 --epochs 3 \
        --project "$P" --noplots &
    local pid=$! i
    for i in $(seq 1200); do
        [ -f "$P/res/weights/last.pt" ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    python -c "import sys, torch; c = torch.load(sys.argv[1], weights_only=True); \
assert c['optimizer'] is not None, 'the run ended before it was killed'; print('killed after epoch', c['epoch'] + 1)" \
        "$P/res/weights/last.pt" && cp -r "$P/res" "$P/res-cpu"
}
step resume-prepare resume_prepare
step resume-here python train.py --resume "$P/res/weights/last.pt" --device "$DEVICE"
step resume-on-cpu python train.py --resume "$P/res-cpu/weights/last.pt" --device cpu
BENCH=(--device "$DEVICE" --amp "$AMP" --imgsz "$IMG" --train-imgsz "$IMG" --batch "$BATCH" --steps 10 --workers 8
       --models yolov5n.yaml yolov8n.yaml yolov8n-seg.yaml)
step bench python -m benchmarks.bench "${BENCH[@]}"
step bench-channels-last python -m benchmarks.bench "${BENCH[@]}" --channels-last

echo
echo "=== benchmark (train img/s on prefetched batches, batch-1 inference ms with NMS, peak GPU memory)"
for name in bench bench-channels-last; do
    echo "$name"
    grep -E "^(model|yolo)" "$OUT/$name.log" || true
done
echo "=== GPU memory of the training runs (GPU_mem column of the last epoch line)"
for name in train-amp-v8 train-amp-v5 train-seg; do
    printf '%-22s %s\n' "$name" "$(grep -oE '[0-9.]+G' "$OUT/$name.log" | tail -1)"
done
echo "=== summary ($DEVICE, amp $AMP, img $IMG, batch $BATCH)"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
