"""InferenceBackend on `.pt` files: the CPU layout (channels_last) and bf16 autocast, against the plain fp32 model."""

import pytest
import torch
from models_testutil import assert_close_per_channel, save_checkpoint

from models.backend import InferenceBackend, flatten_outputs
from models.checkpoints import attempt_load
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel

MODELS = [("yolov5n.yaml", DetectionModel), ("yolov8n.yaml", DetectionModel), ("yolov8n-seg.yaml", SegmentationModel),
          ("yolov8n-cls.yaml", ClassificationModel)]


def _outputs(model, x):
    with torch.no_grad():
        return flatten_outputs(model(x))


@pytest.mark.parametrize("cfg,cls", MODELS, ids=[m[0].removesuffix(".yaml") for m in MODELS])
def test_pt_backend_is_channels_last_on_cpu_and_gives_the_model_outputs(cfg, cls, tmp_path):
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    backend = InferenceBackend(weights)
    convs = [p for p in backend.model.parameters() if p.ndim == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    ref_model = attempt_load(weights, fuse=False)  # contiguous, unfused
    x = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(0))
    (out, structure), (ref, ref_structure) = _outputs(backend, x), _outputs(ref_model, x)
    assert structure == ref_structure
    for o, r in zip(out, ref):
        assert o.dtype == torch.float32
        assert_close_per_channel(o, r)


@pytest.mark.parametrize("cfg,cls", MODELS[1:], ids=[m[0].removesuffix(".yaml") for m in MODELS[1:]])
def test_bf16_backend_runs_bf16_and_returns_fp32_near_the_fp32_outputs(cfg, cls, tmp_path):
    weights = save_checkpoint(cfg, cls, tmp_path / "model.pt")
    backend, ref_backend = InferenceBackend(weights, bf16=True), InferenceBackend(weights)
    seen = []
    conv = next(m for m in backend.model.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    (out, _), (ref, _) = _outputs(backend, x), _outputs(ref_backend, x)
    assert seen == [torch.bfloat16]
    for o, r in zip(out, ref):
        assert o.dtype == torch.float32
        assert_close_per_channel(o, r, rtol=0.1)  # bf16 keeps 8 significant bits: a few % after ~100 layers


def test_a_tensorrt_engine_refuses_an_input_beyond_its_profile_in_one_line():
    """The engine is built for batches up to max(--batch-size, 32) of images up to the export's size; TensorRT met a
    larger input (val --batch-size 64, predict --img 1280) only by leaving the outputs' shapes unknown, and the empty
    output tensors they sized raised. The runner's other parts need a GPU: only its check runs here."""
    from models.runtimes import TensorRTRunner
    from utils.errors import BadOption

    runner = object.__new__(TensorRTRunner)
    runner.weights, runner.max_shape = "best.engine", (32, 3, 640, 640)
    for shape in [(33, 3, 64, 64), (1, 3, 672, 640), (1, 3, 640, 704)]:
        with pytest.raises(BadOption, match=rf"^--weights best.engine: the engine takes up to 32 images of up to "
                                            rf"640x640, got \({shape[0]}, 3, {shape[2]}, {shape[3]}\)"):
            runner(torch.zeros(shape))
