"""The C heap of a script's process: glibc is told to keep the memory a training step frees, for the next step.

A step allocates and frees the same few GBs of activations, gradients and loss tensors every time. With glibc's
defaults most of that goes back to the kernel between steps (blocks above a dynamic threshold are mmap'd and
unmapped one by one, and the heap's free top is trimmed), so every page is faulted in and zeroed again on the next
step: on a 2-core CPU, a yolov8n step at 640 px took 1.6 s with the settings below against 2.0-2.2 s without
(docs/performance.md, "The C heap"). The price is that resident memory stays at its high-water mark instead of
falling between steps: 0.3-0.4 GB more peak in that step benchmark, 0.9 GB in a whole 3-epoch run at 640 px.
"""

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
SETTINGS = (
    (M_MMAP_THRESHOLD, 32 << 20),  # the largest glibc accepts: only blocks above 32 MB get a mapping of their own
    (M_TRIM_THRESHOLD, 2**31 - 1),  # mallopt takes an int: up to 2 GB of free heap top is kept
    (M_TOP_PAD, 1 << 30),  # the heap grows 1 GB at a time; pages count as resident only once touched
)
USER_KNOBS = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def strict_overcommit(path="/proc/sys/vm/overcommit_memory"):
    """True where the kernel charges every reservation against a commit limit (mode 2): there the 1 GB top pad
    would count in full, touched or not."""
    try:
        return open(path).read().strip() == "2"
    except OSError:
        return False


def keep_freed_memory(environ=os.environ):
    """Apply SETTINGS with glibc's mallopt; True when applied. Not on other systems or C libraries, not under strict
    overcommit, and not when the user chose their own malloc settings (any of USER_KNOBS set) or allocator (jemalloc,
    tcmalloc, mimalloc through LD_PRELOAD): theirs stand."""
    if not sys.platform.startswith("linux") or any(environ.get(k) for k in USER_KNOBS):
        return False
    if "malloc" in environ.get("LD_PRELOAD", "") or strict_overcommit():
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other C libraries
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return all(mallopt(param, value) == 1 for param, value in SETTINGS)


def release_heap():
    """Hand the C heap's free pages back to the kernel (glibc's malloc_trim), where the settings above would keep
    them: in a loader worker once a group is made (its private memory grew from group to group, 99 -> 230 MB over
    200 batches at 12,800 images, 320 px: one call per group of ~128 images, against ~128 decodes), and in the
    training process once a dataset's labels are built (a first scan's records are transient, 0.1 GB per 10,000
    segmentation images)."""
    if _LIBC[0] is None:
        try:
            _LIBC[0] = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else False
            _LIBC[0].malloc_trim.argtypes = (ctypes.c_size_t,)
        except (OSError, AttributeError):  # musl and other C libraries
            _LIBC[0] = False
    if _LIBC[0]:
        _LIBC[0].malloc_trim(0)


_LIBC = [None]  # glibc, once loaded; False where there is none
