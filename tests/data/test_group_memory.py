"""A group's memory in a loader worker (issue 60): its samples are let go as they are collated, so a worker holds a
group's samples or its batches, not both."""

import gc
import weakref

from data.loader import _CollateGroup


class _Sample:
    def __init__(self, i):
        self.i = i


def test_group_samples_are_released_as_they_are_collated():
    refs, alive_at_collate = [], []

    def collate(chunk):
        gc.collect()
        alive_at_collate.append(sum(r() is not None for r in refs))
        return [s.i for s in chunk]

    samples = [_Sample(i) for i in range(10)]
    refs += [weakref.ref(s) for s in samples]
    batches = _CollateGroup(collate, 3, drop_single=True)(samples)
    del samples
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]  # the single last image left out
    # each batch is collated while the samples of the batches before it are gone
    assert alive_at_collate == [10, 7, 4]


def test_group_without_drop_keeps_a_single_last_batch():
    assert _CollateGroup(lambda c: len(c), 3, drop_single=False)([_Sample(i) for i in range(7)]) == [3, 3, 1]
    assert _CollateGroup(lambda c: len(c), 1, drop_single=False)([_Sample(i) for i in range(2)]) == [1, 1]
