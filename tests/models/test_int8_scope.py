"""The INT8 scope cases (int8_scope_cases.py) run in a pytest process of their own: OpenVINO's runtime, once loaded,
made later onnxruntime sessions of the same process segfault (test_export_openvino.py says more)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openvino")
pytest.importorskip("nncf")
CASES = Path(__file__).with_name("int8_scope_cases.py")


def test_int8_scope_cases_pass_in_their_own_process(request):
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
                         capture_output=True, text=True, timeout=900, cwd=request.config.rootpath)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
