"""models/yolo.py: YAML parsing rules, model construction, parameter counts, forward layouts, fuse."""


import pytest
import torch
import torch.nn as nn
import yaml
from models_testutil import randomise_bn

from models import registry, yolo
from models.common import C3, C2f, Conv
from models.heads import AnchorFreeDetect, AnchorFreeSegment, Classify, Detect, Segment
from models.yolo import (
    MODELS_DIR,
    ClassificationModel,
    DetectionModel,
    Model,
    PoseModel,
    SegmentationModel,
    head_task,
    make_divisible,
    parse_model,
    yaml_model_load,
)
from utils.errors import BadModelYaml

V5 = [f"yolov5{s}.yaml" for s in "nsmlx"]
V8 = [f"yolov8{s}.yaml" for s in "nsmlx"]
PARAMS = {
    ("yolov5n.yaml", 80): 1_872_157,
    ("yolov5s.yaml", 80): 7_235_389,
    ("yolov8n.yaml", 80): 3_157_200,
    ("yolov8s.yaml", 80): 11_166_560,
    ("yolov8n-seg.yaml", 80): 3_409_968,
    # YOLOv5u: Ultralytics' DetectionModel('yolov5{n,s,m,l,x}.yaml') counts
    ("yolov5nu.yaml", 80): 2_654_816,
    ("yolov5su.yaml", 80): 9_153_152,
    ("yolov5mu.yaml", 80): 25_111_456,
    ("yolov5lu.yaml", 80): 53_225_024,
    ("yolov5xu.yaml", 80): 97_276_448,
    ("yolov5n-seg.yaml", 80): 1_991_549,
    ("yolov8n-cls.yaml", 1000): 2_719_288,
    ("yolov5n-cls.yaml", 1000): 2_493_000,
    # official Ultralytics PoseModel counts at its YAML's nc=1, kpt_shape [17, 3]
    ("yolov8n-pose.yaml", 1): 3_295_470,
    ("yolov8s-pose.yaml", 1): 11_626_046,
    ("yolov8m-pose.yaml", 1): 26_464_462,
    ("yolov8l-pose.yaml", 1): 44_489_196,
    ("yolov8x-pose.yaml", 1): 69_491_724,
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def build(cfg, nc):
    if "-cls" in cfg:
        return ClassificationModel(cfg, nc=nc)
    if "-pose" in cfg:
        return PoseModel(cfg, nc=nc)
    return (SegmentationModel if "-seg" in cfg else DetectionModel)(cfg, nc=nc)


@pytest.mark.parametrize("cfg,nc", list(PARAMS))
def test_parameter_counts(cfg, nc):
    assert n_params(build(cfg, nc)) == PARAMS[(cfg, nc)]


@pytest.mark.parametrize("cfg", V5 + V8 + ["yolov5nu.yaml"])
def test_detector_builds_and_forwards(cfg):
    torch.manual_seed(0)
    m = DetectionModel(cfg, nc=3)
    x = torch.rand(1, 3, 64, 64)
    train_out = m.train()(x)
    assert [tuple(t.shape[2:4]) for t in train_out] == [(8, 8), (4, 4), (2, 2)]
    y, raw = m.eval()(x)
    assert torch.equal(m.stride, torch.tensor([8.0, 16.0, 32.0]))
    if "v5" in cfg and not cfg.endswith("u.yaml"):
        assert isinstance(m.model[-1], Detect) and train_out[0].shape == (1, 3, 8, 8, 8)
        assert y.shape == (1, 3 * 84, 8)
    else:
        assert isinstance(m.model[-1], AnchorFreeDetect) and train_out[0].shape == (1, 64 + 3, 8, 8)
        assert y.shape == (1, 4 + 3, 84)
    assert torch.isfinite(y).all()


def test_v8_scale_from_name():
    d = yaml_model_load("yolov8s-seg.yaml")
    assert d["scale"] == "s" and d["yaml_file"].endswith("yolov8-seg.yaml")
    assert yaml_model_load("yolov8.yaml")["scale"] == "n"  # no scale letter: the first scale
    assert "scale" not in yaml_model_load("yolov5s.yaml")
    d = yaml_model_load("yolov5su.yaml")  # YOLOv5u: the anchor-free head on the v5 body, Ultralytics' yolov5su.pt
    assert d["scale"] == "s" and d["yaml_file"].endswith("yolov5u.yaml") and "anchors" not in d
    with pytest.raises(BadModelYaml, match="yolov9q"):
        yaml_model_load("yolov9q.yaml")


def test_yaml_path_and_dict_inputs(tmp_path):
    d = yaml_model_load("yolov5n.yaml")
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in d.items() if k != "yaml_file"}))
    a, b = DetectionModel(str(path)), DetectionModel(d)
    assert n_params(a) == n_params(b) == PARAMS[("yolov5n.yaml", 80)]
    assert "yaml_file" not in a.yaml or a.yaml["yaml_file"] == str(path)
    DetectionModel(d, nc=5)
    assert d["nc"] == 80, "the caller's dict must not be mutated"


def test_detect_name_resolves_by_anchors_key():
    d = yaml_model_load("yolov8n.yaml")
    assert isinstance(DetectionModel(d).model[-1], AnchorFreeDetect)
    assert isinstance(DetectionModel("yolov5n.yaml").model[-1], Detect)
    assert isinstance(SegmentationModel("yolov8n-seg.yaml").model[-1], AnchorFreeSegment)
    assert isinstance(SegmentationModel("yolov5n-seg.yaml").model[-1], Segment)


@pytest.mark.parametrize("cfg, task", [("yolov5n.yaml", "detect"), ("yolov7-tiny.yaml", "detect"),
                                       ("yolov8n.yaml", "detect"), ("yolov5n-seg.yaml", "segment"),
                                       ("yolov8n-seg.yaml", "segment"), ("yolov8n-pose.yaml", "pose"),
                                       ("yolov5n-cls.yaml", "classify"), ("yolov8n-cls.yaml", "classify")])
def test_head_task_from_the_yaml_agrees_with_the_built_head(cfg, task):
    d = yaml_model_load(cfg)
    cls = {"segment": SegmentationModel, "pose": PoseModel, "classify": ClassificationModel}.get(task, DetectionModel)
    assert head_task(d) == task == cls(d).model[-1].task


def test_a_model_class_refuses_a_head_it_does_not_serve():
    """A classifier's head in a box model crashed finding strides; a box head in a classifier trained, then crashed
    in the loss; a YAML ending in no head at all crashed on the missing stride."""
    with pytest.raises(BadModelYaml, match=r"yolov8-cls\.yaml: ends in Classify \(a classify model\)"):
        DetectionModel("yolov8n-cls.yaml")
    with pytest.raises(BadModelYaml, match=r"yolov5n\.yaml: ends in Detect \(a detect model\); .* classify heads"):
        ClassificationModel("yolov5n.yaml")
    headless = {**yaml_model_load("yolov5n.yaml"), "head": []}
    assert head_task(headless) is None
    with pytest.raises(BadModelYaml, match="ends in SPPF, not a head"):
        DetectionModel(headless)


def test_unknown_module_names_file_and_line(tmp_path):
    text = (MODELS_DIR / "yolov5n.yaml").read_text().replace("[-1, 1, SPPF, [1024, 5]]", "[-1, 1, SPPX, [1024, 5]]")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "SPPX" in s)
    with pytest.raises(ValueError, match=rf"bad\.yaml:{line} \(backbone\[9\]\): unknown module 'SPPX'"):
        DetectionModel(str(path))


def test_unknown_activation_rejected():
    d = yaml_model_load("yolov5n.yaml")
    d["backbone"][0][3] = [64, 6, 2, 2, "nn.Gelu(1)"]
    with pytest.raises(ValueError, match=r"unsupported argument 'nn.Gelu\(1\)'"):
        DetectionModel(d)
    d["backbone"][0][3] = [64, 6, 2, 2, "nn.LeakyReLU(0.1 +)"]
    with pytest.raises(ValueError, match="unsupported argument"):
        DetectionModel(d)
    for bad in ("nn.Gelu()", "print(1)", "nn.ReLU(x)", ["nn.ReLU()"]):
        d = yaml_model_load("yolov5n.yaml")
        d["activation"] = bad
        with pytest.raises(BadModelYaml, match="activation"):
            DetectionModel(d)


def test_model_wide_activation_is_every_default_conv_activation():
    """yolov5s-LeakyReLU.yaml: every Conv told act=True activates with LeakyReLU(0.1), each with its own module; a
    Conv told act=False stays linear; the heads' plain convolutions have none. The setting ends with the parse."""
    m = DetectionModel("yolov5s-LeakyReLU.yaml")
    convs = [x for x in m.modules() if isinstance(x, Conv)]
    assert convs and all(isinstance(c.act, nn.LeakyReLU) and c.act.negative_slope == 0.1 for c in convs)
    assert len({id(c.act) for c in convs}) == len(convs)
    assert not any(isinstance(x, nn.SiLU) for x in m.modules())
    assert isinstance(Conv(3, 8).act, nn.SiLU)
    ref = DetectionModel("yolov5s.yaml")
    assert [(k, v.shape) for k, v in m.state_dict().items()] == [(k, v.shape) for k, v in ref.state_dict().items()]


def test_activation_argument_goes_to_act():
    d = yaml_model_load("yolov5n.yaml")
    d["backbone"][1][3] = [128, 3, 2, "None", 1, "nn.LeakyReLU(0.1)"]
    conv = DetectionModel(d).model[1]
    assert isinstance(conv.act, nn.LeakyReLU) and conv.act.negative_slope == 0.1
    assert conv.conv.stride == (2, 2) and conv.conv.dilation == (1, 1)


def test_bookkeeping_attributes_and_scaling():
    m = DetectionModel("yolov5s.yaml")
    assert [(x.i, x.f, x.type) for x in m.model][:3] == [(0, -1, "Conv"), (1, -1, "Conv"), (2, -1, "C3")]
    assert (m.model[12].f, m.model[12].type) == ([-1, 6], "Concat")
    assert m.model[-1].f == [17, 20, 23] and m.model[-1].type == "Detect"
    assert all(x.np == n_params(x) for x in m.model)
    assert m.save == [4, 6, 10, 14, 17, 20, 23]
    # width 0.5: 64 -> 32 channels; depth 0.33: C3 n=9 -> 3 bottlenecks
    assert m.model[0].conv.out_channels == 32 and isinstance(m.model[6], C3) and len(m.model[6].m) == 3
    assert m.model[0].conv.kernel_size == (6, 6) and m.model[0].conv.padding == (2, 2)
    v8l = DetectionModel("yolov8l.yaml")  # max_channels 512 caps the 1024-channel layers
    assert isinstance(v8l.model[8], C2f) and v8l.model[8].cv2.conv.out_channels == 512
    assert make_divisible(1024 * 0.25) == 256 and make_divisible(3.1) == 8


def test_batchnorm_settings():
    bns = [x for x in DetectionModel("yolov8n.yaml").modules() if isinstance(x, nn.BatchNorm2d)]
    assert {(b.eps, b.momentum) for b in bns} == {(0.001, 0.03)}
    bns = [x for x in ClassificationModel("yolov8n-cls.yaml").modules() if isinstance(x, nn.BatchNorm2d)]
    assert {(b.eps, b.momentum) for b in bns} == {(1e-5, 0.1)}  # as the official YOLOv8 classifier


def test_anchors_in_grid_units_and_order_check():
    m = DetectionModel("yolov5n.yaml")
    torch.testing.assert_close(m.model[-1].anchors[0, 0], torch.tensor([10 / 8, 13 / 8]))
    torch.testing.assert_close(m.model[-1].anchors[2, 2], torch.tensor([373 / 32, 326 / 32]))
    d = yaml_model_load("yolov5n.yaml")
    d["anchors"] = d["anchors"][::-1]  # largest anchors listed first: must be flipped back to P3..P5
    torch.testing.assert_close(DetectionModel(d).model[-1].anchors, m.model[-1].anchors)


def test_bias_init_applied():
    m = DetectionModel("yolov8n.yaml")
    assert torch.all(m.model[-1].cv2[0][-1].bias == 1.0)


def test_names_nc_hyp_and_alias():
    m = DetectionModel("yolov5n.yaml", nc=4)
    assert m.names == {0: "0", 1: "1", 2: "2", 3: "3"} and m.nc == 4 and m.yaml["nc"] == 4
    assert m.default_hyp == "hyp.scratch-low.yaml"
    assert DetectionModel("yolov8n.yaml").default_hyp == "hyp.v8.yaml"
    assert DetectionModel("yolov5nu.yaml").default_hyp == "hyp.v8.yaml"  # Ultralytics trains YOLOv5u as YOLOv8
    assert SegmentationModel("yolov8n-seg.yaml").default_hyp == "hyp.v8.yaml"
    assert SegmentationModel("yolov5n-seg.yaml").default_hyp == "hyp.scratch-low.yaml"
    assert ClassificationModel("yolov5n-cls.yaml").default_hyp == "hyp.cls.yaml"
    assert ClassificationModel("yolov8n-cls.yaml").default_hyp == "hyp.cls.yaml"
    assert DetectionModel({k: v for k, v in m.yaml.items() if k != "hyp"}).default_hyp is None
    assert Model is DetectionModel
    with pytest.raises(AttributeError):
        m.default_hyp = "x"


def test_init_criterion_delegates_to_build_criterion(monkeypatch):
    seen = {}
    monkeypatch.setattr(yolo, "build_criterion", lambda model, hyp, **kw: seen.setdefault("args", (model, hyp, kw)))
    m = DetectionModel("yolov5n.yaml")
    m.init_criterion({"box": 0.05}, extra=1)
    assert seen["args"] == (m, {"box": 0.05}, {"extra": 1})


@pytest.mark.parametrize("cfg", ["yolov5n.yaml", "yolov8n.yaml", "yolov5n-seg.yaml", "yolov8n-seg.yaml"])
def test_fuse_keeps_eval_outputs(cfg):
    torch.manual_seed(0)
    m = randomise_bn(build(cfg, 80)).eval()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        ref = m(x)
        m.fuse()
        out = m(x)
    assert not any(isinstance(x, nn.BatchNorm2d) for x in m.modules())
    scale = ref[0].abs().max()
    torch.testing.assert_close(out[0] / scale, ref[0] / scale, atol=1e-4, rtol=0)
    if "seg" in cfg:
        p_ref, p_out = (ref[1], out[1]) if "v5" in cfg else (ref[1][2], out[1][2])
        torch.testing.assert_close(p_out, p_ref, atol=1e-4 * float(p_ref.abs().max()), rtol=0)


@pytest.mark.parametrize("cfg", ["yolov5n-seg.yaml", "yolov8n-seg.yaml"])
def test_segmentation_layouts(cfg):
    m = SegmentationModel(cfg, nc=3)
    x = torch.rand(2, 3, 64, 64)
    out = m.train()(x)
    ev = m.eval()(x)
    if "v5" in cfg:
        feats, proto = out
        assert feats[0].shape == (2, 3, 8, 8, 5 + 3 + 32) and proto.shape == (2, 32, 16, 16)
        y, proto, raw = ev
        assert y.shape == (2, 252, 40) and len(raw) == 3
    else:
        feats, mc, proto = out
        assert feats[0].shape == (2, 67, 8, 8) and mc.shape == (2, 32, 84) and proto.shape == (2, 32, 16, 16)
        y, (raw, mc, proto) = ev
        assert y.shape == (2, 4 + 3 + 32, 84)


@pytest.mark.parametrize("cfg", ["yolov5n-cls.yaml", "yolov8n-cls.yaml"])
def test_classifiers_build_and_forward(cfg):
    m = ClassificationModel(cfg, nc=7)
    assert isinstance(m.model[-1], Classify) and m.nc == 7 and len(m.model) == 10
    x = torch.rand(2, 3, 64, 64)
    assert m.train()(x).shape == (2, 7)
    torch.testing.assert_close(m.eval()(x).sum(1), torch.ones(2))


@pytest.mark.parametrize("cfg", [f"yolov5{s}-cls.yaml" for s in "smlx"] + [f"yolov8{s}-cls.yaml" for s in "smlx"])
def test_larger_classifiers_parse(cfg):
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        layers, _ = parse_model(yaml_model_load(cfg), 3)
    assert isinstance(layers[-1], Classify) and layers[-1].linear.out_features == 1000
    width = {"s": 0.5, "m": 0.75, "l": 1.0, "x": 1.25}[cfg[6]]
    assert layers[-1].conv.conv.in_channels == 1024 * width


def test_classifier_from_detection_model():
    torch.manual_seed(0)
    det = DetectionModel("yolov5n.yaml")
    cls = ClassificationModel.from_detection_model(det, nc=10)
    ref = ClassificationModel("yolov5n-cls.yaml", nc=10)
    keys = list(cls.state_dict())
    assert keys == list(ref.state_dict())
    assert {k.split(".")[1] for k in keys} == {str(i) for i in range(10)}
    assert "model.9.conv.conv.weight" in keys and "model.9.linear.weight" in keys
    det_state = det.state_dict()
    for k, v in cls.state_dict().items():
        if not k.startswith("model.9."):
            assert torch.equal(v, det_state[k]), k
    assert cls.default_hyp == "hyp.cls.yaml" and cls.nc == 10
    assert cls.eval()(torch.rand(1, 3, 64, 64)).shape == (1, 10)


def test_info_reports_parameters_and_flops():
    layers, params, grads, gflops = DetectionModel("yolov5n.yaml").info()
    assert (layers, params) == (25, PARAMS[("yolov5n.yaml", 80)])
    assert grads == params and 3.5 < gflops < 5.5  # official: 4.5 GFLOPs at 640


@pytest.mark.parametrize("cfg", ["yolov5n.yaml", "yolov8n.yaml", "yolov7-tiny.yaml", "yolov8n-seg.yaml",
                                 "yolov5n-seg.yaml", "yolov8n-cls.yaml"])
@pytest.mark.parametrize("fused", [False, True])
def test_flops_equal_torchs_flop_counter(cfg, fused):
    """The hook count (made at the largest stride and scaled) against torch's FlopCounterMode at the size itself
    (which counts every matmul-like op it dispatches)."""
    from torch.utils.flop_counter import FlopCounterMode

    from models.yolo import ClassificationModel, SegmentationModel

    model_cls = SegmentationModel if "-seg" in cfg else ClassificationModel if "-cls" in cfg else DetectionModel
    model = model_cls(cfg, nc=3).eval()
    if fused:
        model.fuse()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, 320, 320))
    expected = counter.get_total_flops() / 1e9
    assert model._gflops(320) == pytest.approx(expected, rel=1e-9) and expected > 0


def test_parse_model_returns_layers_and_save():
    d = yaml_model_load("yolov8n.yaml")
    layers, save = parse_model(d, 3)
    assert isinstance(layers, nn.Sequential) and len(layers) == 23 and save == [4, 6, 9, 12, 15, 18, 21]
    assert isinstance(layers[0], Conv)


class _Widen(nn.Module):
    """A block defined outside models/: it declares its parser rules and a fuse step, and is only registered."""

    channel_rule = "width"
    repeat_arg = True

    def __init__(self, c1, c2, n=1):
        super().__init__()
        self.m = nn.Sequential(*(nn.Conv2d(c1 if i == 0 else c2, c2, 1) for i in range(n)))
        self.fused = False

    def forward(self, x):
        return self.m(x)

    def fuse(self):
        self.fused = True


def test_blocks_declare_their_parser_rules(monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, "Widen", _Widen)
    d = yaml_model_load("yolov8n.yaml")  # scale n: depth 0.33, width 0.25
    d["backbone"][1] = [-1, 6, "Widen", [128]]
    m = DetectionModel(d)
    w = m.model[1]
    # width 0.25 -> 32 channels after the 16 of layer 0; depth 0.33 -> 2 repeats passed as the third argument
    assert isinstance(w, _Widen) and len(w.m) == 2
    assert (w.m[0].in_channels, w.m[0].out_channels) == (16, 32)
    m.fuse()
    assert w.fused and not any(isinstance(x, nn.BatchNorm2d) for x in m.modules())
    monkeypatch.setattr(_Widen, "channel_rule", "sideways")
    with pytest.raises(NotImplementedError, match="channel_rule"):  # a bug in the block, not a YAML mistake
        DetectionModel(d)


def test_output_layout_comes_from_the_head():
    for m in (DetectionModel("yolov5n.yaml", nc=3), DetectionModel("yolov8n.yaml", nc=3),
              SegmentationModel("yolov5n-seg.yaml", nc=3), SegmentationModel("yolov8n-seg.yaml", nc=3)):
        assert m.output_layout == m.model[-1].output_layout and m.output_layout.nc == 3


def test_pose_model_takes_the_dataset_kpt_shape():
    """The dataset YAML's kpt_shape replaces the model YAML's; the model YAML it keeps says which it was built with."""
    m = PoseModel("yolov8n-pose.yaml", nc=2, kpt_shape=[4, 3])
    assert m.kpt_shape == (4, 3) and m.yaml["kpt_shape"] == [4, 3] and m.output_layout.kpt_shape == (4, 3)
    assert PoseModel(m.yaml).kpt_shape == (4, 3)  # rebuilt from its own YAML, as a checkpoint is


def test_pose_yaml_with_a_bad_kpt_shape_names_its_line(tmp_path):
    cfg = yaml_model_load("yolov8n-pose.yaml")
    f = tmp_path / "bad-pose.yaml"
    f.write_text(yaml.safe_dump({**{k: v for k, v in cfg.items() if k not in ("yaml_file", "scale")},
                                 "kpt_shape": [17, 5]}, sort_keys=False))
    with pytest.raises(BadModelYaml, match="bad-pose.yaml:.*kpt_shape"):
        PoseModel(f)


@pytest.mark.parametrize("change, error", [
    (lambda d: d.update(width_multiple=-1), "width_multiple must be a finite number > 0, got -1"),
    (lambda d: d.update(depth_multiple="x"), "depth_multiple must be a finite number > 0, got 'x'"),
    (lambda d: d.update(anchors=[[10, 13, 16]]), r"'anchors' is \[\[10, 13, 16\]\], beyond what a model takes"),
    (lambda d: d["backbone"].__setitem__(1, [-1, 1, "Conv", [64, 3, 2, 7]]), "its layers do not fit together"),
])
def test_a_yaml_torch_cannot_build_is_one_error_naming_it(tmp_path, change, error):
    """Each was a RuntimeError traceback from torch (a negative channel count, anchors that are no pairs, a strided
    conv whose output no longer meets the skip connection it is concatenated with)."""
    d = yaml.safe_load((MODELS_DIR / "yolov5n.yaml").read_text())
    change(d)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(BadModelYaml, match=error):
        DetectionModel(str(path), nc=3)
