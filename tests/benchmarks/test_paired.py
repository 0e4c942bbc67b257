"""benchmarks/paired.py: each side trains on its own copy of the data, `together` runs the two sides at once, and the
ratio is head's median over base's."""

import json
import sys
from types import SimpleNamespace

from benchmarks import paired


def test_each_side_gets_its_own_copy_of_the_data_without_caches(tmp_path):
    src = tmp_path / "shapes"
    (src / "labels").mkdir(parents=True)
    (src / "labels" / "train.yolo-engine.cache").write_text("another version's cache")
    (src / "labels" / "a.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    (src / "shapes-det.yaml").write_text(f"path: {src}\ntrain: images/train\n")
    copy = paired.dataset_copy(src / "shapes-det.yaml", tmp_path / "data-head")
    assert copy.read_text() == f"path: {tmp_path / 'data-head'}\ntrain: images/train\n"
    assert (tmp_path / "data-head" / "labels" / "a.txt").exists()
    assert not (tmp_path / "data-head" / "labels" / "train.yolo-engine.cache").exists()


def fake_run(tmp_path, monkeypatch, seconds):
    """Sides whose 'training' writes a profile with `seconds[side]` of forward_backward; each first waits (up to
    20 s) for the other side's start marker when `wait` is set, so only runs started together can both finish."""
    code = ("import json, sys, time, pathlib; run, fb, other, wait = sys.argv[1:5]; run = pathlib.Path(run); "
            "run.mkdir(parents=True, exist_ok=True); (run.parent / (run.name + '.started')).touch(); "
            "t = time.time()\n"
            "while wait == '1' and not list(run.parent.glob(other + '*.started')) and time.time() - t < 20: "
            "time.sleep(0.05)\n"
            "(run / 'profile.json').write_text(json.dumps({'sections': {'forward_backward': {'s': float(fb)}}}))")

    def command(tree, data, opt, run_dir):
        other = "head" if run_dir.name.startswith("base") else "base"
        return [sys.executable, "-c", code, str(run_dir), str(seconds[run_dir.name[:4]]), other, opt.wait]

    monkeypatch.setattr(paired, "command", command)
    sides = {"base": (tmp_path, None), "head": (tmp_path, None)}
    return sides


def test_together_starts_both_sides_before_waiting_for_either(tmp_path, monkeypatch):
    sides = fake_run(tmp_path, monkeypatch, {"base": 2.0, "head": 3.0})
    opt = SimpleNamespace(mode="together", threads=1, wait="1")
    rows = [paired.run_pair(sides, opt, tmp_path, i) for i in range(3)]
    med = paired.report(rows)
    assert med["base"]["forward_backward"] == 2.0 and med["head"]["forward_backward"] == 3.0
    assert all(r["base"][0] < 15 and r["head"][0] < 15 for r in rows)  # neither waited out the other's 20 s


def test_alternate_runs_one_side_after_the_other(tmp_path, monkeypatch, capsys):
    sides = fake_run(tmp_path, monkeypatch, {"base": 4.0, "head": 2.0})
    opt = SimpleNamespace(mode="alternate", threads=0, wait="0")
    rows = [paired.run_pair(sides, opt, tmp_path, i) for i in range(2)]
    paired.report(rows)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("forward_backward"))
    assert line.split()[1:] == ["4.00", "2.00", "0.500"]
    started = sorted(tmp_path.glob("runs/*.started"), key=lambda p: p.stat().st_mtime_ns)
    assert [p.name[:4] for p in started] == ["base", "head", "base", "head"]
    assert json.loads((tmp_path / "runs" / "head1" / "profile.json").read_text())
