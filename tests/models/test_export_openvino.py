"""The OpenVINO cases (openvino_cases.py) run in a pytest process of their own. OpenVINO's runtime, once loaded, made
later onnxruntime sessions of the same process segfault, and the whole suite died with it at its last test (CI, exit
139): sorting them last was not enough. A crash there now fails this one test, with the child's output."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")
CASES = Path(__file__).with_name("openvino_cases.py")


def test_openvino_cases_pass_in_their_own_process(request):
    markexpr = request.config.getoption("markexpr") or ""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markexpr, str(CASES)],
                         capture_output=True, text=True, timeout=900, cwd=request.config.rootpath)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
