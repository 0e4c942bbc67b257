"""Running an attack in a process of its own whose memory is capped, and reading back what it cost.

The machine is shared: a loader that failed to refuse a file would allocate gigabytes. The child runs under
RLIMIT_DATA (heap and anonymous mappings, what torch's and numpy's allocators use) of `limit` bytes, so an unrefused
attack dies there as out of memory instead of taking the machine; its peak resident memory is read back through a
small parent process (Linux keeps a process's peak across exec, so a child of the large test process would report
the test's own peak).
"""

import os
import re
import subprocess
import sys
from types import SimpleNamespace

from utils.files import ROOT

_PARENT = """
import resource, subprocess, sys
limit = int(sys.argv[1])
cap = lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
r = subprocess.run(sys.argv[2:], preexec_fn=cap, capture_output=True, text=True)
sys.stdout.write(r.stdout)
sys.stderr.write(r.stderr)
print("peak_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "rc", r.returncode)
"""


def run_capped(argv, limit=2 << 30, timeout=300, cwd=ROOT, env=None):
    """Run `argv` (after the Python interpreter) with its memory capped at `limit` bytes. Returns returncode, stdout,
    stderr, peak (bytes) and the `error:` lines of stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    r = subprocess.run([sys.executable, "-c", _PARENT, str(limit), sys.executable, *argv], capture_output=True,
                       text=True, timeout=timeout, cwd=cwd, env=env)
    found = re.search(r"peak_kib (\d+) rc (-?\d+)\s*$", r.stdout)
    assert found, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout[:found.start()]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    return SimpleNamespace(returncode=int(found.group(2)), stdout=out, stderr=r.stderr, peak=int(found.group(1)) * 1024,
                           errors=errors)


def refused_once(r, words):
    """Whether the run ended as a refusal should: status 2, one `error:` line holding `words`, no traceback."""
    return r.returncode == 2 and len(r.errors) == 1 and words in r.errors[0] and "Traceback" not in r.stderr

