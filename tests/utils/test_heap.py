"""utils/heap.py: freed memory stays in the process (measured on resident memory), and a user's own malloc settings or
allocator stand."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import utils.heap
import utils.run
from utils.heap import keep_freed_memory

ROOT = Path(__file__).resolve().parents[2]
glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# 12 blocks of 20 MB, each touched, then freed: resident memory before, and after the free, in MB
PROBE = textwrap.dedent("""
    import sys
    import torch
    from utils.heap import keep_freed_memory

    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    applied = keep_freed_memory() if sys.argv[1] == "keep" else False
    before = rss_mb()
    blocks = [torch.ones(5 << 20) for _ in range(12)]
    del blocks
    print(applied, rss_mb() - before)
""")


def _retained_mb(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    applied, mb = out.stdout.split()
    return applied == "True", float(mb)


@glibc
def test_freed_blocks_stay_resident_for_the_next_step():
    applied, kept = _retained_mb("keep")
    default_applied, returned = _retained_mb("default")
    assert applied and not default_applied
    assert kept > 200, f"only {kept:.0f} MB of the 240 MB freed stayed in the process"
    assert returned < 40, f"glibc's defaults kept {returned:.0f} MB: the probe no longer tells the two apart"


@pytest.mark.parametrize("env", [{"MALLOC_TOP_PAD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                 {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}])
def test_a_users_own_malloc_settings_stand(env):
    assert keep_freed_memory(env) is False


@glibc
def test_every_script_keeps_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(utils.run, "keep_freed_memory", lambda: calls.append(1))
    assert utils.run.run_cli(lambda opt: opt, lambda: "parsed") == "parsed"
    assert calls == [1]


def test_strict_overcommit_is_read_from_the_kernel_setting(tmp_path, monkeypatch):
    setting = tmp_path / "overcommit_memory"
    for mode, strict in (("0\n", False), ("1\n", False), ("2\n", True)):
        setting.write_text(mode)
        assert utils.heap.strict_overcommit(setting) is strict
    assert utils.heap.strict_overcommit(tmp_path / "missing") is False
    monkeypatch.setattr(utils.heap, "strict_overcommit", lambda: True)
    assert keep_freed_memory({}) is False
