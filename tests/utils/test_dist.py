"""Distributed helpers under 2 gloo processes: SyncBatchNorm, and that `loss *= WORLD_SIZE` under DDP gives the
single-process gradient of the concatenated batch."""

import pytest
import torch
import torch.nn as nn

from tests.ddp_utils import spawn, train_mode
from utils import dist as du
from utils.errors import BadOption
from utils.files import ROOT, yaml_load


def test_rank_queries_single_process(monkeypatch):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert (du.get_rank(), du.get_local_rank(), du.get_world_size()) == (-1, -1, 1)
    assert du.is_main_process() and not du.is_distributed()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert du.get_rank() == 3 and du.get_world_size() == 4  # read lazily, at call time


def test_several_gpus_for_one_training_process_is_refused_naming_torchrun(monkeypatch):
    """`train.py --device 0,1` without torchrun trained on GPU 0 alone, without a word."""
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    with pytest.raises(BadOption, match=r"--device 0,1: one process trains on one GPU; to train on 2, .* "
                                        r"torch.distributed.run --nproc_per_node 2 train.py"):
        du.select_device("0,1", batch_size=16)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert du.select_device("0,1") == torch.device("cuda", 0), "val and predict take the first"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert du.select_device("0,1", batch_size=16) == torch.device("cuda", 1), "under torchrun: the rank's GPU"


def _syncbn_worker(rank, world_size, out):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5)
    bn = du.CPUSyncBatchNorm(3, eps=1e-3, momentum=0.03)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    xr = x[rank * 2 : rank * 2 + 2].clone().requires_grad_(True)
    y = bn(xr)
    (y * torch.arange(y.numel()).view_as(y)).sum().backward()
    torch.save({"y": y.detach(), "gx": xr.grad, "gw": bn.weight.grad, "rm": bn.running_mean,
                "rv": bn.running_var}, f"{out}/{rank}.pt")


@pytest.mark.ddp
def test_cpu_sync_batchnorm_matches_global_batch(tmp_path):
    spawn(_syncbn_worker, 2, str(tmp_path))
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5)
    bn = nn.BatchNorm2d(3, eps=1e-3, momentum=0.03)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    x.requires_grad_(True)
    y = bn(x)
    w = torch.cat([torch.arange(y[:2].numel()).view_as(y[:2])] * 2)
    (y * w).sum().backward()
    r = [torch.load(tmp_path / f"{i}.pt") for i in range(2)]
    torch.testing.assert_close(torch.cat([r[0]["y"], r[1]["y"]]), y.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat([r[0]["gx"], r[1]["gx"]]), x.grad, rtol=1e-4, atol=1e-5)
    # parameter gradients stay per rank (DDP would sum them); their sum is the global batch's gradient
    torch.testing.assert_close(r[0]["gw"] + r[1]["gw"], bn.weight.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(r[0]["rm"], bn.running_mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(r[0]["rv"], bn.running_var, rtol=1e-4, atol=1e-6)


def _batch(seed=0, n=4, size=96):
    """n images; every image carries the same three targets so that each rank's share is balanced."""
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(n, 3, size, size, generator=g)
    boxes = torch.tensor([[0, 0.3, 0.3, 0.2, 0.25], [1, 0.6, 0.5, 0.4, 0.3], [2, 0.7, 0.75, 0.1, 0.15]])
    targets = torch.cat([torch.cat([torch.full((3, 1), float(i)), boxes], 1) for i in range(n)])
    return img, targets


def _model(cfg, sync_bn):
    from models.yolo import DetectionModel

    torch.manual_seed(1)
    return train_mode(DetectionModel(cfg, nc=3), freeze_bn=not sync_bn)


def _grad_worker(rank, world_size, cfg, sync_bn, out, memory_format=torch.contiguous_format):
    model = _model(cfg, sync_bn)
    hyp = yaml_load(ROOT / "data" / "hyps" / model.default_hyp)
    criterion = model.init_criterion(hyp, imgsz=96)
    train_model, plain = du.prepare_model(model, torch.device("cpu"), sync_bn=sync_bn, memory_format=memory_format)
    if memory_format == torch.channels_last:  # the layout really reached the parameters DDP buckets
        assert plain.model[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    img, targets = _batch()
    per = img.shape[0] // world_size
    mine = targets[(targets[:, 0] >= rank * per) & (targets[:, 0] < (rank + 1) * per)].clone()
    mine[:, 0] -= rank * per
    x = img[rank * per : (rank + 1) * per]
    loss, _ = criterion(train_model(x), {"img": x, "targets": mine})
    (loss * world_size).backward()  # the engine's rule: DDP averages, so scale by WORLD_SIZE
    if rank == 0:
        torch.save({k: p.grad.clone() for k, p in plain.named_parameters() if p.grad is not None}, f"{out}/g.pt")


def _check_grads(tmp_path, cfg, sync_bn, memory_format=torch.contiguous_format):
    spawn(_grad_worker, 2, cfg, sync_bn, str(tmp_path), memory_format)
    model = _model(cfg, sync_bn)
    hyp = yaml_load(ROOT / "data" / "hyps" / model.default_hyp)
    criterion = model.init_criterion(hyp, imgsz=96)
    img, targets = _batch()
    loss, _ = criterion(model(img), {"img": img, "targets": targets})
    loss.backward()
    ddp = torch.load(tmp_path / "g.pt")
    single = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    assert ddp.keys() == single.keys()
    num = sum(((ddp[k] - single[k]) ** 2).sum() for k in single)
    den = sum((single[k] ** 2).sum() for k in single)
    assert den > 0
    assert (num / den).sqrt() < 1e-4, f"relative gradient difference {(num / den).sqrt():.2e}"


@pytest.mark.ddp
def test_ddp_gradient_equals_single_process_v5(tmp_path):
    _check_grads(tmp_path, "yolov5n.yaml", sync_bn=False)


@pytest.mark.ddp
def test_ddp_gradient_equals_single_process_v5_sync_bn(tmp_path):
    _check_grads(tmp_path, "yolov5n.yaml", sync_bn=True)


@pytest.mark.ddp
def test_ddp_gradient_equals_single_process_channels_last(tmp_path):
    """The trainer's CPU layout (channels_last parameters, gradients as views of DDP's buckets) against the
    contiguous single-process model. (yolov5n: the v8 loss divides by each rank's own sum of target scores, as the
    official one does, so its DDP gradient is not the concatenated batch's.)"""
    _check_grads(tmp_path, "yolov5n.yaml", sync_bn=True, memory_format=torch.channels_last)


def _zero_first_worker(rank, world_size, out):
    import time
    from pathlib import Path

    marker = Path(out) / "made_by_rank0"
    with du.torch_distributed_zero_first(rank):
        if rank == 0:
            time.sleep(0.5)
            marker.write_text("0")
        seen = marker.exists()  # rank 1 runs this only after rank 0 left the block
    (Path(out) / f"seen{rank}").write_text(str(seen))
    assert du.broadcast_object("stop" if rank == 0 else None) == "stop"


@pytest.mark.ddp
def test_zero_first_and_broadcast(tmp_path):
    spawn(_zero_first_worker, 2, str(tmp_path))
    assert (tmp_path / "seen1").read_text() == "True"


def test_a_session_leaves_the_group_after_a_clean_exit_only(monkeypatch):
    """One teardown rule for train and val: after an error the group stays for run_cli's exit path (rank 0 hosts its
    store, and tearing it down while a peer still reports its own error would fail that peer)."""
    calls = []
    monkeypatch.setattr(du, "setup_ddp", lambda device: calls.append("join"))
    monkeypatch.setattr(du, "cleanup_ddp", lambda: calls.append("leave"))
    with du.session("cpu"):
        calls.append("work")
    with pytest.raises(RuntimeError), du.session("cpu"):
        raise RuntimeError("a bug")
    assert calls == ["join", "work", "leave", "join"]
