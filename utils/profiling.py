"""--profile: where the wall time of a training process goes, as one table at the end of the run and profile.json.

A user times the whole command; the model step is only part of it. `RunProfile` splits the process's wall time into
named sections that the trainer opens around its work (`with profile("validation"): ...`). Time is charged to the
innermost open section only, so nested sections (a plot drawn inside validation) never count twice and the sections
always add up to at most the wall time; the rest is reported as "other". Start-up (imports, option parsing, device
and process-group set-up) is the time from the process's start to the profile's creation.

Disabled (no --profile), a section is one shared `nullcontext` and `timed` returns its iterable unchanged: no clock
reads and no CUDA synchronisation. Enabled on CUDA, every section boundary synchronises the device, so a region's
time includes the kernels it queued rather than only their launch (this slows the run a little: the price of
knowing).
"""

import contextlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path

from utils.log import LOGGER

_IMPORTED = time.time()  # the start-up fallback where /proc is not available
_last_report = None  # when the previous profile of this process reported (evolve's generations, tests)

# key in profile.json -> label in the table, in table order; "startup" and "other" are not timed sections
ROWS = {
    "startup": "start-up",
    "setup": "set-up",
    "data_wait": "data wait",
    "forward_backward": "forward+loss+backward",
    "optimizer_step": "optimizer step (incl. EMA)",
    "validation": "validation",
    "checkpoints": "checkpoint saving",
    "plots_logs": "plotting/logging",
    "other": "other",
}
# sections the code may open: the timed rows, and the whole train loop (its inclusive time gives img/s; its own
# time, outside the sections inside it, is part of "other")
SECTIONS = (set(ROWS) - {"startup", "other"}) | {"train_loop"}
_OFF = contextlib.nullcontext()
_END = object()


def process_start_time(proc=Path("/proc")):
    """Unix time at which this process started: Linux's `starttime` (clock ticks after boot, field 22 of
    /proc/self/stat) plus the boot time (now minus /proc/uptime). Elsewhere, the time this module was imported."""
    try:
        ticks = int((proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()[19])  # after the command name
        uptime = float((proc / "uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no os.sysconf (Windows)
        return _IMPORTED


class RunProfile:
    """Accumulating, exclusive section timers; `profile(name, items=n)` is a context manager.

    `sync`: called at every section boundary (torch.cuda.synchronize on CUDA). `clock`: seconds, monotonic.
    `startup`: seconds the process ran before this profile was created (default: measured).
    """

    def __init__(self, enabled=True, sync=None, clock=time.perf_counter, startup=None):
        self.enabled, self.sync, self.clock = enabled, sync, clock
        if startup is None and enabled:  # the previous run of this process, if any, counts as its start-up
            startup = time.time() - (_last_report or process_start_time())
        self.startup = max(startup or 0.0, 0.0)
        self.origin = self._mark = clock()
        self.own = defaultdict(float)  # time with this section innermost
        self.total = defaultdict(float)  # time with this section open
        self.calls, self.items = defaultdict(int), defaultdict(int)
        self._open = []  # names of the open sections, innermost last

    @classmethod
    def for_run(cls, enabled, device):
        sync = None
        if enabled and device.type == "cuda":
            import torch

            def sync():
                torch.cuda.synchronize(device)
        return cls(enabled, sync=sync)

    def __call__(self, name, items=0):
        """The context manager timing section `name`; `items` is added to its count (images of a batch)."""
        if not self.enabled:
            return _OFF
        if name not in SECTIONS:
            raise KeyError(f"unknown profile section {name!r}; known: {sorted(SECTIONS)}")
        return self._section(name, items)

    @contextlib.contextmanager
    def _section(self, name, items):
        start = self._charge()
        self._open.append(name)
        try:
            yield
        finally:
            end = self._charge()
            self._open.pop()
            self.total[name] += end - start
            self.calls[name] += 1
            self.items[name] += items

    def _charge(self):
        """Give the time since the last boundary to the innermost open section; returns now."""
        if self.sync is not None:
            self.sync()
        now = self.clock()
        if self._open:
            self.own[self._open[-1]] += now - self._mark
        self._mark = now
        return now

    def timed(self, iterable, name):
        """`iterable`, with the time spent fetching each item charged to section `name` (a loader's data wait)."""
        if not self.enabled:
            return iterable
        return self._timed(iterable, name)

    def _timed(self, iterable, name):
        with self(name):
            it = iter(iterable)  # a DataLoader starts its workers here
        while True:
            with self(name):
                item = next(it, _END)
            if item is _END:
                return
            yield item

    def summary(self):
        """{'wall_s', 'sections': {key: {'s', 'pct'}} for every row, 'batches', 'train_images', 'train_img_per_s'}."""
        elapsed = self.clock() - self.origin
        wall = self.startup + elapsed
        seconds = {"startup": self.startup, **{k: self.own[k] for k in ROWS if k not in ("startup", "other")}}
        seconds["other"] = wall - sum(seconds.values())  # >= 0: each instant is charged to one section at most
        images, loop = self.items["forward_backward"], self.total["train_loop"]
        return {
            "wall_s": round(wall, 4),
            "sections": {k: {"s": round(s, 4), "pct": round(100 * s / wall, 2) if wall > 0 else 0.0}
                         for k, s in seconds.items()},
            "batches": self.calls["forward_backward"],
            "train_images": images,
            "train_loop_s": round(loop, 4),
            "train_img_per_s": round(images / loop, 2) if loop > 0 else 0.0,
            "cuda_synchronized": self.sync is not None,
        }

    def report(self, save_dir):
        """Print the table and write save_dir/profile.json; nothing when disabled. Returns the summary or None."""
        global _last_report
        if not self.enabled:
            return None
        s = self.summary()
        lines = [f"Profile: {s['wall_s']:.1f} s wall from process start" +
                 (" (CUDA synchronized at every section boundary)" if s["cuda_synchronized"] else ""),
                 f"{'section':<28}{'s':>9}{'%':>7}"]
        lines += [f"{ROWS[k]:<28}{v['s']:>9.2f}{v['pct']:>7.1f}" for k, v in s["sections"].items()]
        lines.append(f"train: {s['train_images']} images in {s['batches']} batches, {s['train_loop_s']:.1f} s in the "
                     f"train loop = {s['train_img_per_s']:.1f} img/s")
        for line in lines:
            LOGGER.info(line)
        path = Path(save_dir) / "profile.json"
        path.write_text(json.dumps(s, indent=2))
        LOGGER.info(f"Profile written to {path}")
        _last_report = time.time()
        return s
