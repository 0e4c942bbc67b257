"""Every criterion gives the loss, loss items and gradients that the criteria of commit 9842094 gave on one fixed
batch (loss_reference.pt, built by make_loss_reference.py): the rewrite that took the host-device synchronisations
out of them changed no number."""

import pytest
import torch
from make_loss_reference import case_names, evaluate


@pytest.mark.parametrize("case", case_names())
def test_loss_and_gradients_equal_the_reference(criteria, reference, case):
    ref = reference[case]
    loss, items, grads = evaluate(criteria[case.removesuffix("-no-overlap")], ref["preds"], ref["batch"])
    torch.testing.assert_close(loss, ref["loss"], rtol=1e-6, atol=0)
    torch.testing.assert_close(items, ref["items"], rtol=1e-6, atol=0)
    assert len(grads) == len(ref["grads"])
    for got, want in zip(grads, ref["grads"]):
        scale = want.abs().max().item() if want.numel() else 0.0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * scale)
