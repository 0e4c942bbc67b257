"""utils/profiling.py on a fake clock: each section gets exactly the time spent in it, nested time counts once, the
rows add up to the wall time, and a disabled profile does no work."""

import json
import time

import pytest

from utils import profiling
from utils.profiling import ROWS, RunProfile, process_start_time


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, s):
        self.now += s


def profile(startup=2.0, **kw):
    clock = FakeClock()
    return RunProfile(clock=clock, startup=startup, **kw), clock


def test_section_gets_the_time_spent_in_it():
    p, clock = profile()
    clock.advance(0.5)  # before any section: "other"
    with p("setup"):
        clock.advance(3.0)
    for _ in range(4):
        with p("forward_backward", items=16):
            clock.advance(0.25)
        clock.advance(0.1)  # between sections: "other"
    s = p.summary()["sections"]
    assert s["setup"]["s"] == 3.0
    assert s["forward_backward"]["s"] == 1.0
    assert s["startup"]["s"] == 2.0
    assert s["other"]["s"] == pytest.approx(0.5 + 4 * 0.1)
    assert p.calls["forward_backward"] == 4 and p.items["forward_backward"] == 64


def test_nested_time_is_charged_to_the_innermost_section_only():
    p, clock = profile()
    with p("validation"):
        clock.advance(1.0)
        with p("plots_logs"):
            clock.advance(2.0)
        clock.advance(0.5)
    assert p.own["validation"] == 1.5 and p.own["plots_logs"] == 2.0
    assert p.total["validation"] == 3.5  # inclusive


def test_rows_add_up_to_wall_time_with_nonnegative_other():
    p, clock = profile(startup=4.0)
    with p("train_loop"):
        for _ in range(3):
            with p("data_wait"):
                clock.advance(0.2)
            with p("forward_backward", items=8):
                clock.advance(0.7)
            with p("optimizer_step"):
                clock.advance(0.1)
            clock.advance(0.05)  # the loop's own work (progress bar, preprocess): "other"
    with p("checkpoints"):
        clock.advance(0.3)
    summary = p.summary()
    rows = summary["sections"]
    assert list(rows) == list(ROWS)
    assert summary["wall_s"] == pytest.approx(4.0 + 3 * 1.05 + 0.3)
    assert sum(r["s"] for r in rows.values()) == pytest.approx(summary["wall_s"])
    assert sum(r["pct"] for r in rows.values()) == pytest.approx(100, abs=0.05)
    assert rows["other"]["s"] == pytest.approx(0.15)
    assert summary["batches"] == 3 and summary["train_images"] == 24
    assert summary["train_img_per_s"] == pytest.approx(24 / 3.15, abs=0.01)


def test_timed_charges_only_the_fetching_of_each_item():
    p, clock = profile()

    def slow_loader():
        for i in range(3):
            clock.advance(0.4)  # the loader's work for item i
            yield i

    class Loader:
        def __iter__(self):
            clock.advance(0.3)  # a DataLoader starting its workers
            return slow_loader()

    seen = []
    for item in p.timed(Loader(), "data_wait"):
        clock.advance(1.0)  # the consumer's work is not data wait
        seen.append(item)
    assert seen == [0, 1, 2]
    assert p.own["data_wait"] == pytest.approx(0.3 + 1.2)


def test_section_exits_cleanly_on_exception():
    p, clock = profile()
    with pytest.raises(RuntimeError), p("validation"):
        clock.advance(1.0)
        raise RuntimeError
    with p("setup"):
        clock.advance(2.0)
    assert p.own == {"validation": 1.0, "setup": 2.0}


def test_sync_runs_at_every_boundary_when_enabled():
    calls = []
    p, clock = profile(sync=lambda: calls.append(1))
    with p("optimizer_step"):
        pass
    assert len(calls) == 2


def test_disabled_profile_does_nothing():
    calls, clock_reads = [], []
    p = RunProfile(enabled=False, sync=lambda: calls.append(1), clock=lambda: clock_reads.append(1) or 0.0)
    clock_reads.clear()  # the constructor's read of the origin
    loader = [1, 2, 3]
    assert p.timed(loader, "data_wait") is loader
    with p("forward_backward", items=16), p("not a section"):  # names are not even checked
        pass
    assert not calls and not clock_reads and not p.own
    assert p.report("/nonexistent") is None


def test_unknown_section_is_a_bug():
    p, _ = profile()
    with pytest.raises(KeyError, match="unknown profile section"):
        p("forward")


def test_report_writes_profile_json(tmp_path, monkeypatch):
    p, clock = profile()
    with p("data_wait"):
        clock.advance(1.0)
    monkeypatch.setattr(profiling, "_last_report", None)  # report() records when it ran; keep other tests clean
    p.report(tmp_path)
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["sections"]["data_wait"]["s"] == 1.0
    assert saved["wall_s"] == 3.0


def test_process_start_from_proc(tmp_path):
    (tmp_path / "self").mkdir()
    hz = profiling.os.sysconf("SC_CLK_TCK")
    # field 22 (starttime) in clock ticks after boot: 990 s; the command name may hold spaces and parentheses
    fields = ["S"] + ["0"] * 18 + [str(990 * hz)] + ["0"] * 30
    (tmp_path / "self" / "stat").write_text(f"123 (py (x) y) {' '.join(fields)}\n")
    (tmp_path / "uptime").write_text("1000.00 1800.00\n")
    assert time.time() - process_start_time(tmp_path) == pytest.approx(10.0, abs=1.0)


def test_process_start_falls_back_to_import_time(tmp_path):
    assert process_start_time(tmp_path / "missing") == profiling._IMPORTED


def test_this_process_started_before_the_module_was_imported():
    assert process_start_time() <= profiling._IMPORTED + 0.02  # /proc/uptime has 10 ms resolution
