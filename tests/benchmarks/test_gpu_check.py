"""benchmarks/gpu_check.sh, the acceptance script a lent GPU runs in one short window, end to end on the CPU at toy
sizes: every step runs and passes, and what it leaves in $OUT is what the device tool brings back.

The end-to-end run starts about 25 processes (8.5 minutes on the loaded 2-core machine, more than the whole suite's
margin under CI's limit): it runs only with YOLO_TEST_GPU_CHECK=1, before a lent GPU's window. The script's syntax is
checked every time."""

import os
import re
import subprocess

import pytest

from utils.files import ROOT

STEPS = ["versions", "data", "hsv-on-device", "syncs-ours", "syncs-ultralytics", "whole-ultralytics", "whole-runs",
         "bench-fp16", "bench-fp16-channels-last", "bench-fp16-cudnn-benchmark", "bench-bf16-profile", "train-seg",
         "train-pose", "kill-and-resume", "cpu-run-resumed-here", "export-and-predict"]


def test_gpu_check_parses():
    r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("YOLO_TEST_GPU_CHECK") != "1",
                    reason="starts about 25 processes, minutes: set YOLO_TEST_GPU_CHECK=1 to run it")
def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    no_peer = tmp_path / "no-ultralytics"  # an interpreter that cannot import ultralytics: the peer's steps skip
    no_peer.write_text("#!/bin/sh\nexit 1\n")
    no_peer.chmod(0o755)
    env = {**os.environ, "DEVICE": "cpu", "SIZES": "tiny", "OUT": str(out), "WORK": str(work), "DEADLINE": "1500",
           "PEER_PYTHON": str(no_peer)}
    r = subprocess.run(["timeout", "1600", "bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env,
                       capture_output=True, text=True)
    summary = (out / "summary.txt").read_text()
    assert r.returncode == 0, summary + r.stderr[-3000:]
    status = dict(re.findall(r"^(\S+) +(ok|skipped|SKIPPED|FAILED|TIMEOUT) ", summary, re.M))
    assert list(status) == STEPS
    peer = {"syncs-ultralytics", "whole-ultralytics"}  # no interpreter that imports ultralytics was given
    assert {k for k, v in status.items() if v != "ok"} == peer
    # the figures a GPU run is for reach the summary
    assert re.search(r"^ours yolov8n.yaml on cpu: \d+ steps; syncs/step \(sync_count.py's rule\): \d+, with host "
                     r"copies: \d+; a median step: \S+ at ", summary, re.M)
    assert re.search(r"colour against OpenCV's, max [01]\.\d+ grey levels", summary)
    assert re.search(r"^yolov8n.yaml +ours +0 ", summary, re.M) and "ours+profile" in summary
    assert len(re.findall(r"^yolov8n.yaml +[\d.]+ +", summary, re.M)) == 4  # one bench.py row per setting
    assert "Self CPU" in (out / "bench.log").read_text()  # the profiler's table
    assert len(re.findall(r"^killed at epoch \d batch \d", summary, re.M)) == 2
    assert summary.count("Resuming training") == 2
    # what the device tool brings back: at most 8 files, 16 MiB each, named plainly, no deeper than 2 folders
    files = [p for p in out.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["bench.log", "setup.log", "summary.txt", "tasks.log", "whole.log"]
    assert all(p.stat().st_size < 16 * 2**20 and re.fullmatch(r"[\w.-]+", p.name) for p in files)
