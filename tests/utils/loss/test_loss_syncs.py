"""How often each criterion (loss and backward) makes the host wait for the device, counted on the CPU
(benchmarks/sync_counter.py): every count is pinned, so that one added back fails here. Lower one on purpose? Update its
budget here and the table in docs/performance.md ("Host-device synchronisations")."""

import pytest
from make_loss_reference import case_names, evaluate

from benchmarks.sync_counter import SyncCounter

# per criterion: what it reads back from the device, where
BUDGET = {
    "v5": {"tolist": 1, "nonzero": 1},  # match_anchors: the candidates and their count per level
    "ota": {"tolist": 2, "nonzero": 1},  # + the matched candidates' count per level
    "v5seg": {"tolist": 2, "nonzero": 1},  # + the positives' count per level and image
    "v8": {"_local_scalar_dense": 1, "nonzero": 2},  # the most targets in an image; anchors inside a box; positives
    "v8seg": {"_local_scalar_dense": 1, "nonzero": 2, "tolist": 1},  # + the positives' count per image
    "v8pose": {"_local_scalar_dense": 1, "nonzero": 2},
}


@pytest.mark.parametrize("case", case_names())
def test_criterion_syncs_are_pinned(criteria, reference, case):
    name = case.removesuffix("-no-overlap")
    ref = reference[case]
    evaluate(criteria[name], ref["preds"], ref["batch"])  # the first call of a shape builds what it keeps
    with SyncCounter() as counter:
        evaluate(criteria[name], ref["preds"], ref["batch"])
    assert dict(counter.ops) == BUDGET[name], dict(counter.where)
