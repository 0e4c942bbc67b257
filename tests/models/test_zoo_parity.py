"""The model zoo against the official packages: every official variant YAML builds the official key list and, with the
same seeded weights, the official outputs (fixtures/zoo_parity.pt; fixtures/make_zoo_parity.py says how it was made).
"""

import pytest
import torch
from fixtures.make_zoo_parity import CASES, FIXTURES, combined_fingerprint, kept_outputs, key_lines, keys_digest
from models_testutil import PARITY, assert_close_per_channel
from parity_weights import seeded_state

from models.yolo import ClassificationModel, DetectionModel, PoseModel, SegmentationModel, yaml_model_load

MODEL_CLASSES = {"detect": DetectionModel, "segment": SegmentationModel, "pose": PoseModel,
                 "classify": ClassificationModel}


@pytest.fixture(scope="module")
def fixtures():
    return torch.load(FIXTURES / "zoo_parity.pt", weights_only=True)


def our_outputs(task, out):
    if task == "classify":
        return out, None
    if task == "segment":
        return out[0], out[1][2]
    return out[0], None


@pytest.mark.skipif(not (PARITY / "inputs.pt").is_file(), reason=f"parity inputs not found at {PARITY}")
@pytest.mark.parametrize("name", list(CASES))
def test_zoo_parity(name, fixtures):
    """Keys and shapes in the official order, then the decoded boxes, scores, mask coefficients, keypoints (and
    prototypes) within 1e-4 of each channel's largest value."""
    _, task, cfg, (h, w), override, _ = CASES[name]
    ref = fixtures[name]
    d = yaml_model_load(cfg)
    d.update(override or {})
    model = MODEL_CLASSES[task](d, nc=1 if task == "pose" else 80).eval()
    lines = key_lines(model.state_dict())
    keys_file = FIXTURES / "zoo_keys" / f"{name}.txt"
    if keys_file.is_file():
        assert lines == keys_file.read_text().splitlines()
    assert (keys_digest(lines), len(lines)) == (ref["keys"], ref["n_keys"])
    assert sum(p.numel() for p in model.parameters()) == ref["params"]
    state = seeded_state(model.state_dict())
    assert combined_fingerprint(state) == ref["fingerprint"]  # the weights the official model ran with
    model.load_state_dict(state, strict=True)
    x = torch.load(PARITY / "inputs.pt", weights_only=True)["x256x320"][:1, :, :h, :w]
    with torch.no_grad():
        got = kept_outputs(task, *our_outputs(task, model(x)))
    assert got.keys() == ref["outputs"].keys()
    for k, expected in ref["outputs"].items():
        assert_close_per_channel(got[k], expected)
