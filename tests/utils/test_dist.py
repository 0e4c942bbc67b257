"""Distributed helpers under 2 gloo processes: SyncBatchNorm, and that `loss *= WORLD_SIZE` under DDP gives the
single-process gradient of the concatenated batch."""

import dataclasses
import os
import random
import socket
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from data.targets import Targets
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
    return img, Targets.from_rows(targets, (size, size))


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
    mine = targets[(targets.image >= rank * per) & (targets.image < (rank + 1) * per)]
    mine = dataclasses.replace(mine, image=mine.image - rank * per)
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


SLURM_TASK = {"SLURM_JOB_ID": "123456", "SLURM_STEP_NUM_TASKS": "12", "SLURM_STEP_TASKS_PER_NODE": "4(x2),2,2",
              "SLURM_STEP_NODELIST": "gpu[07-09,12]", "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}


def _launch_env(monkeypatch, env):
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", *SLURM_TASK):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_srun_tasks_take_their_ranks_from_slurm(monkeypatch):
    """Task 9 of 12 on the third of four nodes (4, 4, 2 and 2 tasks): the ranks, rank 0's node and a port from the
    job id; torchrun's variables, where set, are the ones read."""
    _launch_env(monkeypatch, SLURM_TASK)
    assert (du.get_rank(), du.get_world_size(), du.get_local_rank(), du.get_local_world_size()) == (9, 12, 1, 2)
    assert du.launcher() == "srun" and du.slurm_job() == "123456"
    assert du.slurm_task_env()["MASTER_ADDR"] == "gpu07" and du.slurm_task_env()["MASTER_PORT"] == "18456"
    monkeypatch.setenv("MASTER_PORT", "29500")  # the user's choice wins
    assert du._env("MASTER_PORT") == "29500"
    monkeypatch.setenv("RANK", "3")  # torchrun under srun: one task per node, torchrun's ranks
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert (du.get_rank(), du.get_world_size(), du.get_local_rank(), du.launcher()) == (3, 16, -1, "")
    # the batch script itself (no step) and a step of one task are one process
    _launch_env(monkeypatch, {k: v for k, v in SLURM_TASK.items() if not k.startswith("SLURM_STEP")})
    assert (du.get_rank(), du.get_world_size(), du.launcher(), du.slurm_job()) == (-1, 1, "", "123456")
    _launch_env(monkeypatch, {**SLURM_TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"})
    assert (du.get_rank(), du.get_world_size()) == (-1, 1)


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("node1,node2", "node1"), ("gpu[07-09,12]", "gpu07"), ("gpu[12,07-09]", "gpu12"),
    ("a[3-4],b1", "a3"), ("rack[2-3]-n[1-4]", "rack2-n1"), ("x-1.cluster", "x-1.cluster")])
def test_first_host_of_a_slurm_node_list(nodelist, first):
    assert du.first_host(nodelist) == first


def test_slurm_tasks_per_node():
    assert du.tasks_per_node("4(x2),3") == [4, 4, 3] and du.tasks_per_node("8") == [8]
    with pytest.raises(ValueError, match="unreadable"):
        du.tasks_per_node("4x2")


def test_an_srun_task_bound_to_one_gpu_uses_it(monkeypatch):
    """srun --gpus-per-task=1 shows each task only its own GPU: local rank 1 takes the one it sees; a task that sees
    every GPU of the node takes the one of its local rank."""
    _launch_env(monkeypatch, SLURM_TASK)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert du.select_device("", batch_size=16) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert du.select_device("", batch_size=16) == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun, a worker without a GPU of its own is refused
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BadOption, match="LOCAL_RANK 1 has no GPU"):
        du.select_device("", batch_size=16)


def _free_slurm_job_id():
    """A job id whose MASTER_PORT (15000 + id % 10000) nothing listens on."""
    for _ in range(100):
        job = random.randrange(10000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 15000 + job))
                return job
            except OSError:
                continue
    pytest.fail("no free port in 15000-24999")


@pytest.mark.ddp
def test_two_srun_tasks_form_a_process_group(tmp_path):
    """Two processes with only SLURM's task variables (as srun sets them, torchrun's absent) join one gloo group at
    the node list's first host and the job id's port."""
    code = ("import torch, torch.distributed as dist; from utils import dist as du\n"
            "with du.session(torch.device('cpu')):\n"
            "    t = torch.tensor([du.get_rank() + 1.0]); dist.all_reduce(t)\n"
            "    print(du.get_rank(), du.get_world_size(), du.get_local_rank(), du.launcher(), int(t.item()))")
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                                "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    slurm = {"SLURM_JOB_ID": str(_free_slurm_job_id()), "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NODELIST": "localhost", "OMP_NUM_THREADS": "1",
             "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**base, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip().splitlines()[-1] for o in outs] == ["0 2 0 srun 3", "1 2 1 srun 3"]
