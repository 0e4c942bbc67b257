#!/usr/bin/env bash
# GPU acceptance in one call of about 6 minutes, the most informative steps first (a lent GPU's window is short):
#
#   OUT=$OUT bash benchmarks/gpu_check.sh                     # on the lent machine: CUDA device 0, fp16
#   DEVICE=cpu SIZES=tiny OUT=/tmp/gc bash benchmarks/gpu_check.sh   # the same steps on a CPU at toy sizes
#
#   setup  ~40 s   versions, the datasets, the device's colour against OpenCV's, host-device synchronisations per
#                  step of each tool (benchmarks/sync_counter.py's count, and CUDA's own under
#                  torch.cuda.set_sync_debug_mode("warn"))
#   whole  ~190 s  yolov8n, 3 epochs at 640 px: ours, Ultralytics, ours --profile (python -m benchmarks.gpu_whole_run)
#   bench  ~70 s   bench.py fp16, fp16 channels_last, fp16 cudnn.benchmark, bf16 with a 10-step profiler table
#   tasks  ~60 s   segment and pose at 320 px, a run killed and resumed on the device (and a CPU run's checkpoint
#                  resumed there), TorchScript and ONNX --half export and predict, a TensorRT engine built,
#                  predicting and validated (or the one line saying what the machine lacks)
#
# Every step runs under its own time limit, cut to what DEADLINE (seconds, default 380) leaves; a step that would
# start with less than 5 s left is skipped. The exit status is non-zero if any step failed or was cut.
# What comes back is $OUT: summary.txt (every step's status and the figures) and one log per group (setup.log,
# whole.log, bench.log, tasks.log), 5 files at most 2 folders down, as the device tool returns them. Data and runs
# go under $WORK, which stays on the machine.
#
# Environment: DEVICE (0, or cpu), OUT, WORK, DEADLINE, SIZES (gpu: the sizes above; tiny: the test's), PYTHON
# (python3 where there is no python), PEER_PYTHON (an interpreter that imports ultralytics; default PYTHON; without
# it the Ultralytics steps are skipped), WHEELS (a folder of wheels installed first, e.g. Ultralytics' and its
# needs), PEER_CONFIG (a folder with Ultralytics' Arial.ttf: offline it cannot fetch it).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-0}
OUT=$(mkdir -p "${OUT:-runs/gpu_check}" && cd "${OUT:-runs/gpu_check}" && pwd)
WORK=$(mkdir -p "${WORK:-/tmp/gpu_check_work}" && cd "${WORK:-/tmp/gpu_check_work}" && pwd)
DEADLINE=${DEADLINE:-380}
export PYTHON=${PYTHON:-python} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python() { command "$PYTHON" "$@"; }
export -f python
if [ -n "${WHEELS:-}" ]; then  # before anything imports them; the device machine has no network
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl \
        >"$OUT/setup.log" 2>&1 || echo "wheels from $WHEELS did not install (see setup.log)"
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PEER_PYTHON=${PEER_PYTHON:-$PYTHON}
# Ultralytics offline: no AMP check download, no font download (its config folder holds the font), no telemetry
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=false YOLO_CONFIG_DIR="$WORK/ultralytics-config"
mkdir -p "$YOLO_CONFIG_DIR"
[ -n "${PEER_CONFIG:-}" ] && cp -r "$PEER_CONFIG"/. "$YOLO_CONFIG_DIR"/

# IMG/BATCH: whole runs and bench.py; TIMG/TBATCH: the tasks; SETS: the datasets; LIMIT multiplies every step's
# time limit
if [ "${SIZES:-gpu}" = tiny ]; then
    IMG=64 BATCH=8 TIMG=64 TBATCH=8 LIMIT=6
    WHOLE=(--n-train 16 --n-val 8 --min-side 64 --epochs 1)
    SETS=(--n-train 16 --n-val 8 --min-side 64 --max-side 96)
    BENCH=(--batch 4 --steps 2 --runs 2 --workers 0 --threads 1) PROFILE_STEPS=2
else
    IMG=640 BATCH=64 TIMG=320 TBATCH=16 LIMIT=1
    WHOLE=(--n-train 2000 --n-val 400 --min-side 512 --epochs 3)
    SETS=(--n-train 256 --n-val 64 --min-side 256 --max-side 640)
    BENCH=(--batch 64 --steps 10 --runs 10 --workers 8) PROFILE_STEPS=10
fi
if [ "$DEVICE" = cpu ]; then FP16=off HALF=""; else FP16=fp16 HALF=--half; fi  # fp16 and --half need CUDA
D="$WORK/data"
SUMMARY=()
FAILED=0

record() {  # record NAME STATUS SECONDS [NOTE]
    SUMMARY+=("$(printf '%-22s %-8s %5ss  %s' "$1" "$2" "$3" "${4:-}")")
}

step() {  # step GROUP NAME LIMIT COMMAND...: COMMAND under LIMIT s (less if DEADLINE is near), output to GROUP.log
    local group=$1 name=$2 limit=$(($3 * LIMIT)) t0=$SECONDS rc; shift 3
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        FAILED=1; record "$name" SKIPPED 0 "DEADLINE ${DEADLINE}s spent"; return 1
    fi
    echo "=== $name (at ${SECONDS}s, limit ${limit}s): $*" >>"$OUT/$group.log"
    timeout -k 5 "$limit" bash -c '"$@"' step "$@" >>"$OUT/$group.log" 2>&1
    rc=$?
    if [ $rc = 0 ]; then
        record "$name" ok $((SECONDS - t0))
    else
        FAILED=1
        record "$name" "$([ $rc = 124 ] || [ $rc = 137 ] && echo TIMEOUT || echo FAILED)" $((SECONDS - t0)) \
            "exit $rc, see $group.log"
    fi
    return $rc
}

skip() {  # skip NAME REASON
    record "$1" skipped 0 "$2"
}

has_peer() { "$PEER_PYTHON" -c "import ultralytics" >/dev/null 2>&1; }

kill_and_resume() {  # kill_and_resume NAME FIRST_DEVICE: a run killed (SIGKILL) after its first last.pt, resumed here
    local run="$WORK/runs/$1" pid i
    rm -rf "$run"
    # the interpreter itself in the background, not the `python` function's subshell: $! is then what is killed
    command "$PYTHON" train.py --data "$D/det.yaml" --cfg yolov8n.yaml --img "$TIMG" --batch-size "$TBATCH" --epochs 2 \
        --device "$2" --project "$WORK/runs" --name "$1" --noplots --save-interval 3it &
    pid=$!
    for i in $(seq 1200); do
        [ -f "$run/weights/last.pt" ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    python -c "import sys; from models.checkpoints import load_checkpoint; c = load_checkpoint(sys.argv[1]); \
assert c['optimizer'] is not None, 'the run ended before it was killed'; \
print('\\nkilled at epoch', c['epoch'] + 2, 'batch', c['batch'])" "$run/weights/last.pt" || return 1
    python train.py --resume "$run/weights/last.pt" --device "$DEVICE"
}

export_and_predict() {  # TorchScript and ONNX (fp16 on a GPU) of the resumed run's best.pt, each predicting
    local w="$WORK/runs/resume/weights/best.pt" f
    python export.py --weights "$w" --device "$DEVICE" --img "$TIMG" --include torchscript onnx $HALF || return 1
    for f in torchscript onnx; do
        python detect.py --weights "${w%.pt}.$f" --device "$DEVICE" --img "$TIMG" --source data/images \
            --project "$WORK/runs" --name "predict-$f" --exist-ok || return 1
    done
}
engine_and_predict() {  # a TensorRT engine (fp16) of the same best.pt, built and predicting, where tensorrt is
    # installed; without it the export's one error line (what is missing) is the step's record
    local w="$WORK/runs/resume/weights/best.pt"
    python export.py --weights "$w" --device "$DEVICE" --img "$TIMG" --include engine || return 1
    python detect.py --weights "${w%.pt}.engine" --device "$DEVICE" --img "$TIMG" --source data/images \
        --project "$WORK/runs" --name predict-engine --exist-ok || return 1
    python val.py --weights "${w%.pt}.engine" --device "$DEVICE" --img "$TIMG" --data "$D/det.yaml" \
        --project "$WORK/runs" --name val-engine --exist-ok
}
export -f kill_and_resume export_and_predict engine_and_predict
export D TIMG TBATCH DEVICE WORK HALF

# ---------------------------------------------------------------- setup
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } \
    >>"$OUT/setup.log" 2>&1
step setup versions 10 python -m benchmarks.device_checks versions
step setup data 30 python -m benchmarks.device_checks data --out "$D" "${SETS[@]}"
step setup hsv-on-device 10 python -m benchmarks.device_checks hsv --device "$DEVICE"
SYNCS=(--data "$D/tiny.yaml" --device "$DEVICE" --project "$WORK/runs")
step setup syncs-ours 25 python -m benchmarks.device_checks syncs --tool ours "${SYNCS[@]}"
if has_peer; then
    step setup syncs-ultralytics 25 "$PEER_PYTHON" -m benchmarks.device_checks syncs --tool ultralytics "${SYNCS[@]}"
else
    skip syncs-ultralytics "$PEER_PYTHON does not import ultralytics"
fi

# ---------------------------------------------------------------- whole runs
has_peer || skip whole-ultralytics "$PEER_PYTHON does not import ultralytics"
step whole whole-runs 190 python -m benchmarks.gpu_whole_run --models yolov8n.yaml --profile --device "$DEVICE" \
    --img "$IMG" --batch "$BATCH" "${WHOLE[@]}" --out "$WORK/whole" --peer-python "$PEER_PYTHON" \
    --run-timeout $((75 * LIMIT)) --budget $((150 * LIMIT))

# ---------------------------------------------------------------- model step (bench.py)
B=(python -m benchmarks.bench --device "$DEVICE" --models yolov8n.yaml --data "$D/det.yaml" --imgsz "$IMG"
   --train-imgsz "$IMG" "${BENCH[@]}")
step bench bench-fp16 20 "${B[@]}" --amp $FP16
step bench bench-fp16-channels-last 20 "${B[@]}" --amp $FP16 --channels-last
step bench bench-fp16-cudnn-benchmark 20 "${B[@]}" --amp $FP16 --cudnn-benchmark
step bench bench-bf16-profile 25 "${B[@]}" --amp bf16 --profile-steps $PROFILE_STEPS

# ---------------------------------------------------------------- tasks, resume, export
T=(--img "$TIMG" --batch-size "$TBATCH" --epochs 1 --device "$DEVICE" --project "$WORK/runs" --exist-ok --noplots)
step tasks train-seg 15 python segment/train.py --cfg yolov8n-seg.yaml --data "$D/seg.yaml" --name seg "${T[@]}"
step tasks train-pose 15 python pose/train.py --cfg yolov8n-pose.yaml --data "$D/pose.yaml" --name pose "${T[@]}"
step tasks kill-and-resume 20 kill_and_resume resume "$DEVICE"
step tasks cpu-run-resumed-here 20 kill_and_resume from-cpu cpu
step tasks export-and-predict 15 export_and_predict
step tasks engine-and-predict 25 engine_and_predict

# ---------------------------------------------------------------- summary
{
    echo "gpu_check: device $DEVICE, sizes ${SIZES:-gpu}, $(date -u +%FT%TZ), ${SECONDS}s, commit $(git rev-parse \
--short HEAD 2>/dev/null || echo unknown)"
    printf '%s\n' "${SUMMARY[@]}"
    echo; echo "--- versions, colour, synchronisations per step"
    grep -hE "^(python |cuda |no CUDA|onnxruntime|no onnxruntime|[0-9]+ CPU)|colour against|syncs/step|CUDA sync" \
        "$OUT/setup.log"
    echo; echo "--- whole runs (gpu_whole_run.py) and ours --profile"
    sed -n '/^model /,$p' "$OUT/whole.log"
    echo; echo "--- GPU memory peaks (ours, whole runs)"
    grep -h "GPU memory peak" "$WORK"/whole/*.log 2>/dev/null
    echo; echo "--- bench.py (train img/s on prefetched batches, batch-1 inference ms with NMS, peak GiB)"
    grep -hE "^(torch |model |yolo)" "$OUT/bench.log"
    echo; echo "--- tasks"
    grep -hE "GPU memory peak|^killed at|Resuming training|^ +all +[0-9]|^(onnx|torchscript|engine): saved|^engine: |needs .*tensorrt" "$OUT/tasks.log"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
exit $FAILED
