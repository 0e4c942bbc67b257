"""Everything distributed lives here: rank queries, process-group set-up, DDP wrapping, SyncBatchNorm, barriers.

Scripts are launched once per process by `torch.distributed.run` (torchrun), which sets RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or by SLURM's srun as one task per process, whose
variables stand in for torchrun's when none of those is set (`slurm_task_env`). This is the only module that reads
them, and it reads them lazily (at call time, never at import), so a module imported before the launcher's
environment is complete still sees the right values.
"""

import contextlib
import datetime
import os
import re
import socket
import time
import uuid

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from utils.errors import BadOption, UserError
from utils.log import LOGGER


def _env_minutes(name, default):
    return datetime.timedelta(minutes=float(os.environ.get(name) or default))


# Joining the group: every worker of a (re)started group starts within seconds of the others, so a peer missing
# after this long is dead and the launcher should restart the group rather than wait.
SETUP_TIMEOUT = _env_minutes("YOLO_DDP_SETUP_TIMEOUT", 5)
# Any one collective: the longest legitimate wait is rank 0 (or each machine's local rank 0) scanning labels or
# caching images while the others wait in a barrier, then a validation pass; a dead peer blocks a collective until
# this expires, so a long timeout (the official repos' 3 h) makes a kill cost that long on every GPU.
DDP_TIMEOUT = _env_minutes("YOLO_DDP_TIMEOUT", 30)


def _env(name):
    """A launch variable: torchrun's, else the one SLURM's variables give (srun tasks), else None."""
    value = os.environ.get(name)
    return value if value not in (None, "") else slurm_task_env().get(name)


def _env_int(name, default):
    value = _env(name)
    return int(value) if value is not None else default


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
SLURM_PORTS = (15000, 10000)  # MASTER_PORT of an srun-launched job: 15000 + job id % 10000, below Linux's ephemeral
# ports (32768-60999), so that no outgoing connection on the first node holds it


def slurm_task_env(environ=os.environ):
    """torchrun's variables for a process that srun started as one task of a step of several tasks: RANK from
    SLURM_PROCID, WORLD_SIZE from SLURM_STEP_NUM_TASKS, LOCAL_RANK from SLURM_LOCALID, LOCAL_WORLD_SIZE from the
    step's tasks on this node (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID), MASTER_ADDR the step's first node, where
    rank 0 runs, MASTER_PORT from the job id (the same on every node, and again when the job is requeued). {} when
    any of torchrun's variables is set (torchrun under srun), outside an srun step (a batch script has no
    SLURM_STEP_NUM_TASKS) and for a step of one task."""
    if any(environ.get(k) for k in TORCHRUN_VARS) or int(environ.get("SLURM_STEP_NUM_TASKS") or 1) < 2:
        return {}
    per_node = tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE") or environ["SLURM_STEP_NUM_TASKS"])
    node = int(environ.get("SLURM_NODEID") or 0)
    base, span = SLURM_PORTS
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_STEP_NUM_TASKS"],
            "LOCAL_RANK": environ.get("SLURM_LOCALID") or "0",
            "LOCAL_WORLD_SIZE": str(per_node[node] if node < len(per_node) else 1),
            "MASTER_ADDR": first_host(environ["SLURM_STEP_NODELIST"]),
            "MASTER_PORT": str(base + int(environ.get("SLURM_JOB_ID") or 0) % span)}


def tasks_per_node(spec):
    """SLURM's tasks-per-node list, '4(x2),3' -> [4, 4, 3]."""
    counts = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            raise ValueError(f"unreadable SLURM tasks-per-node list {spec!r}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def first_host(nodelist):
    """The first host of a SLURM node list: 'gpu[07-09,12],cpu1' -> 'gpu07', 'rack[2-3]-n[1-4]' -> 'rack2-n1'."""
    first = re.split(r",(?![^\[]*\])", nodelist.strip())[0]  # the first name or range outside brackets
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], first)


def launcher():
    """What started this process: 'torchrun' (torch.distributed.run, whose agent outlives and restarts its
    workers), 'srun' (one SLURM task per rank) or '' (one process, or ranks set by hand)."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    return "srun" if slurm_task_env() else ""


def slurm_job():
    """The id of the SLURM job this process runs in ('' outside one): its scheduler may signal it twice, once
    through the batch script and once directly, and requeues it under the same id."""
    return os.environ.get("SLURM_JOB_ID", "")


def get_rank():
    """Global rank; -1 when not launched by torchrun or srun (single process)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", -1)


def get_local_rank():
    """Rank within this machine (selects the GPU); -1 when single process."""
    return _env_int("LOCAL_RANK", -1)


def use_launcher_local_rank(local_rank):
    """`--local-rank` from torch.distributed.launch: the local rank, unless the environment already gives one."""
    os.environ.setdefault("LOCAL_RANK", str(local_rank))


def get_local_world_size():
    """Number of processes on this machine; 1 when single process."""
    return _env_int("LOCAL_WORLD_SIZE", 1)


def get_world_size():
    """Number of processes across all machines; 1 when single process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def is_distributed():
    return get_world_size() > 1


def is_main_process():
    return get_rank() in (-1, 0)


def barrier():
    """Wait for every rank; a no-op outside a process group."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[max(get_local_rank(), 0)])
        else:
            dist.barrier()


def select_device(device="", batch_size=None):
    """Pick the torch.device for this process from a user string: '', 'cpu', '0', '0,1,2,3', 'cuda:1'.

    Under torchrun every process takes the GPU numbered by its LOCAL_RANK among the visible ones, so
    `--device 0,1,2,3` only restricts which GPUs are visible (CUDA_VISIBLE_DEVICES is set before CUDA starts).
    """
    spec = str(device).strip().lower().replace("cuda:", "").replace(" ", "")
    if spec == "cpu" or (spec == "" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if spec:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", spec)
        if not torch.cuda.is_available():
            raise BadOption(f"--device {device} requested but CUDA is not available; use --device cpu")
        n_visible = torch.cuda.device_count()
        if n_visible < len(spec.split(",")):
            raise BadOption(f"--device {device} requested but only {n_visible} CUDA devices are visible")
        n = len(spec.split(","))
        if batch_size is not None and n > 1 and get_world_size() == 1:  # one process would train on one of them
            raise BadOption(f"--device {device}: one process trains on one GPU; to train on {n}, launch one process "
                            f"per GPU: python -m torch.distributed.run --nproc_per_node {n} train.py ... --device "
                            f"{device}")
    local_rank = get_local_rank()
    index = max(local_rank, 0)
    if launcher() == "srun" and torch.cuda.device_count() == 1:
        index = 0  # srun gave this task a GPU of its own (--gpus-per-task=1, --gpu-bind): the one it sees
    if index >= torch.cuda.device_count():
        raise BadOption(f"LOCAL_RANK {local_rank} has no GPU: only {torch.cuda.device_count()} are visible")
    if batch_size is not None and get_world_size() == 1 and torch.cuda.device_count() > 1 and not spec:
        LOGGER.warning("several GPUs are visible but this is one process: launch with torchrun to use them all")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def api_device(device=None):
    """select_device's reading for one process's caller, without its effects (CUDA_VISIBLE_DEVICES, set_device):
    the torch.device a Python caller names (torch.hub's `device=`, YOLO.predict's on arrays) as the scripts'
    --device reads it: None or '' (CUDA where there is one, else the CPU), a torch.device, a GPU index (0, '0'),
    'cuda', 'cuda:1', 'cpu' in any case and spacing. BadOption for anything else, or a GPU without CUDA."""
    if isinstance(device, torch.device):
        spec = str(device)
    elif device is None or str(device).strip() == "":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        spec = str(device).strip().lower().replace(" ", "")
    spec = f"cuda:{spec}" if spec.isdecimal() else spec
    if spec != "cpu" and not re.fullmatch(r"cuda(:\d+)?", spec):
        raise BadOption(f"device={device!r}: give 'cpu', a GPU index (0) or 'cuda:N'")
    if spec != "cpu" and not torch.cuda.is_available():
        raise BadOption(f"device={device!r} requested but CUDA is not available; use device='cpu'")
    return torch.device(spec)


def get_restart_count():
    """How many times torchrun has restarted this worker group (0 on the first start and outside torchrun)."""
    return _env_int("TORCHELASTIC_RESTART_COUNT", 0)


def setup_ddp(device):
    """Join the process group once, from a script's main(): NCCL for CUDA, gloo for CPU. No-op when single process.

    The group is built on a store that holds no keys from an earlier worker group (`_fresh_store`): torchrun keeps
    its own store alive across restarts, and a restarted group that reads the dead group's keys fails to connect
    (static rendezvous) or waits forever (c10d).
    """
    if get_world_size() == 1 or (dist.is_available() and dist.is_initialized()):
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    # lets a hung NCCL collective raise after DDP_TIMEOUT instead of blocking, so torchrun can restart the group
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    store = _fresh_store(rank, world_size)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=DDP_TIMEOUT)
    LOGGER.info(f"DDP: rank {get_rank()}/{get_world_size()} (local {get_local_rank()}) backend={backend}"
                + (" from SLURM's task variables" if launcher() == "srun" else "")
                + (f", restart {get_restart_count()}" if get_restart_count() else ""))


def _fresh_store(rank, world_size):
    """A TCPStore for this group alone.

    Outside torchrun's agent store (plain env launch, or torchrun handing out a new MASTER_PORT per round), rank 0
    hosts it at MASTER_ADDR:MASTER_PORT. Under the agent store, which outlives restarts, rank 0 hosts a new store
    on a free port and publishes `host:port:token` there; the others connect, and a stale entry (the dead group's
    rank 0) fails to connect or carries another token, so they read it again until rank 0 has written the new one.
    A prefix from TORCHELASTIC_RESTART_COUNT is not enough: with c10d a healthy node restarts for a new peer without
    counting, so the counts of different machines can differ. The dead store's socket must be closed, not only
    unserved: TCPStore's constructor waits without limit for the answer of a socket that accepts but is never
    served, which is why loader workers, forked with it open, die with their rank (`die_with_parent`).
    """
    addr, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=SETUP_TIMEOUT)
    agent = dist.TCPStore(addr, port, world_size, is_master=False, timeout=SETUP_TIMEOUT)
    key = "yolo/process_group_store"
    if rank == 0:
        host = _reachable_addr(addr)
        store = dist.TCPStore(host, 0, world_size, is_master=True, timeout=SETUP_TIMEOUT, wait_for_workers=False)
        token = f"{host}:{store.port}:{uuid.uuid4().hex}"
        store.set(key, token)
        agent.set(key, token)
        return store
    deadline = time.monotonic() + SETUP_TIMEOUT.total_seconds()
    while True:
        token = agent.get(key).decode()  # blocks until the first group's rank 0 has written it
        host, port, _ = token.rsplit(":", 2)
        if _listening(host, int(port)):  # a plain socket first: a dead store fails at once, and quietly
            with contextlib.suppress(RuntimeError):  # DistStoreError, DistNetworkError: not (or no longer) ours
                store = dist.TCPStore(host, int(port), world_size, is_master=False,
                                      timeout=datetime.timedelta(seconds=10))
                if store.get(key).decode() == token:
                    store.set_timeout(SETUP_TIMEOUT)
                    return store
        if time.monotonic() > deadline:
            raise TimeoutError(f"DDP: rank 0's store {token} unreachable after {SETUP_TIMEOUT}")
        time.sleep(0.5)


def _listening(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _reachable_addr(master_addr):
    """The address other machines reach this one by: MASTER_ADDR when it is this machine's, else its FQDN."""
    with contextlib.suppress(OSError):
        ip = socket.gethostbyname(master_addr)
        if ip.startswith("127.") or ip in socket.gethostbyname_ex(socket.gethostname())[2]:
            return master_addr
    return socket.getfqdn()


def cleanup_ddp():
    """Leave the process group after a clean run (keeps later collectives from hanging on a dead group)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def session(device):
    """A script's time in the process group: joined on entry (`setup_ddp`; nothing under one process), left when the
    block ends cleanly. After an exception the group is left as it is: the process exits next (utils/run.run_cli
    gives the peers a bounded grace, then os._exit), and rank 0 tearing the group down, whose store it hosts, while a
    peer still reports its own error would turn that peer's exit into a failure."""
    setup_ddp(device)
    yield
    cleanup_ddp()


_first_blocks = []  # the store keys of the torch_distributed_zero_first block this process is in
_first_count = [0]  # blocks entered so far: every rank enters the same ones in the same order
POLL_S = 2.0  # how often a waiting rank reads the store


@contextlib.contextmanager
def torch_distributed_zero_first(local_rank):
    """Let local rank 0 go first (download, scan labels, write caches); the others wait, then reuse its work.

    Keyed on the local rank because caches and downloads live on each machine's own disk. The waiting is not a
    barrier, which would end the job after DDP_TIMEOUT whatever the scan's size: every rank counts itself done in
    the process group's store (the others at once, local rank 0 after its work) and waits until all are, for as
    long as some rank's work reports progress (`progress`) at least once per DDP_TIMEOUT.
    """
    initialized = dist.is_available() and dist.is_initialized()
    if not initialized:
        yield
        return
    _first_count[0] += 1
    keys = f"yolo/first/{_first_count[0]}/done", f"yolo/first/{_first_count[0]}/progress"
    if local_rank not in (-1, 0):
        _wait_first(*keys)
    _first_blocks.append(keys)
    try:
        yield
    except UserError:
        # release the waiting ranks before leaving: they then meet the same mistake and report it themselves,
        # instead of failing inside the wait when this process exits
        if local_rank == 0:
            _wait_first(*keys)
        raise
    finally:
        _first_blocks.pop()
    if local_rank == 0:
        _wait_first(*keys)


def progress(n=1):
    """Inside torch_distributed_zero_first: tell the waiting ranks that this rank's work goes on (n more items)."""
    if _first_blocks:
        dist.distributed_c10d._get_default_store().add(_first_blocks[-1][1], n)


def _wait_first(done, beats):
    """Count this rank done, wait for every rank to be, then meet them in a barrier (which no longer waits)."""
    store = dist.distributed_c10d._get_default_store()
    store.add(done, 1)
    limit = DDP_TIMEOUT.total_seconds()
    seen, deadline, pause = None, time.monotonic() + limit, 0.01
    while store.add(done, 0) < get_world_size():
        beat = store.add(beats, 0)
        if beat != seen:
            seen, deadline = beat, time.monotonic() + limit
        if time.monotonic() > deadline:
            raise RuntimeError(f"DDP: no rank's work went on for {limit / 60:g} minutes (YOLO_DDP_TIMEOUT) while "
                               f"{get_world_size() - store.add(done, 0)} of them had not finished it")
        time.sleep(pause)
        pause = min(2 * pause, POLL_S)  # quick blocks cost the waiting ranks little, long ones few reads
    barrier()


def convert_sync_bn(model, device):
    """Swap BatchNorm for a cross-rank version so batch statistics cover the global batch.

    CUDA uses torch.nn.SyncBatchNorm. torch's SyncBatchNorm refuses to run on CPU, so under gloo we use
    `CPUSyncBatchNorm`, which all-reduces the per-channel sums itself.
    """
    if get_world_size() == 1:
        return model
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return CPUSyncBatchNorm.convert(model)


class _AllReduceSum(torch.autograd.Function):
    """all_reduce(SUM) whose backward is also an all_reduce: each rank's statistic feeds every rank's output."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CPUSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d with statistics over the whole distributed batch, for the gloo backend.

    Same parameters and buffers as BatchNorm2d (state-dict compatible). Ranks must call it the same number of
    times (true for DDP training, where every rank runs the same graph).
    """

    def forward(self, x):
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        c = x.shape[1]
        n = torch.tensor([x.numel() / c], dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), n])
        stats = _AllReduceSum.apply(stats)
        total = stats[-1]
        mean = stats[:c] / total
        var = stats[c : 2 * c] / total - mean * mean
        with torch.no_grad():
            self.num_batches_tracked += 1
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
            unbiased = var.detach() * total / (total - 1).clamp(min=1)
            self.running_var.mul_(1 - m).add_(unbiased, alpha=m)
        y = (x - mean[None, :, None, None]) * torch.rsqrt(var[None, :, None, None] + self.eps)
        return y * self.weight[None, :, None, None] + self.bias[None, :, None, None]

    @classmethod
    def convert(cls, module):
        if isinstance(module, nn.BatchNorm2d) and not isinstance(module, cls):
            new = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
            new.load_state_dict(module.state_dict())
            new.train(module.training)
            return new
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child))
        return module


def smart_DDP(model, device):
    """Wrap for DDP. find_unused_parameters stays False: every criterion adds zero-weight terms so each head
    parameter gets a gradient even on a rank whose batch has no targets (the v8 hang reported upstream).
    gradient_as_bucket_view: the gradients are the all-reduce buckets themselves instead of a second copy, one
    model's worth of gradient memory less per GPU (step time on 2 CPU ranks: the same within noise,
    benchmarks/ddp_overhead.py)."""
    ids = dict(device_ids=[device.index], output_device=device.index) if device.type == "cuda" else {}
    return DDP(model, gradient_as_bucket_view=True, **ids)


def prepare_model(model, device, sync_bn=False, memory_format=torch.contiguous_format):
    """The one place that fixes the wrap order: to(device, memory_format) -> SyncBatchNorm -> DDP (which lays its
    gradient buckets out after the parameters' strides, so the layout is chosen before it).

    Returns (train_model, model): the first is what the loop calls (DDP-wrapped when distributed), the second the
    plain module kept for EMA, saving and validation.
    """
    model = model.to(device, memory_format=memory_format)
    if sync_bn:
        if get_world_size() > 1:
            model = convert_sync_bn(model, device).to(device)
        else:
            LOGGER.warning("--sync-bn has no effect in a single process")
    if get_world_size() > 1:
        return smart_DDP(model, device), model
    return model, model


def de_parallel(model):
    """The bare model behind a DDP / DataParallel wrapper (the one used for EMA, saving and validation)."""
    return model.module if isinstance(model, (nn.DataParallel, DDP)) else model


def on_main(fn, *args):
    """fn(*args) run on rank 0 alone (reads the disk, decides), its result on every rank; a user error it raises
    is raised on every rank too, so each ends with the same one-line message instead of waiting for rank 0."""
    result = error = None
    if is_main_process():
        try:
            result = fn(*args)
        except UserError as e:
            error = e
    result, error = broadcast_object((result, error))
    if error is not None:
        raise error
    return result


def broadcast_object(obj, src=0):
    """Send a picklable object from rank `src` to all ranks (used for the stop flag); identity when single."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj, dst=0):
    """Every rank's picklable `obj`, as a list in rank order on rank `dst` (None on the others); [obj] when single."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * get_world_size() if get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def any_rank(flag):
    """True on every rank if `flag` is true on any (a decision all ranks must take together)."""
    return any_ranks(flag)[0]


def any_ranks(*flags):
    """For each flag, True on every rank if it is true on any: several decisions in one collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return tuple(bool(f) for f in flags)
    t = torch.tensor([float(f) for f in flags], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def all_reduce_mean(tensor):
    """Mean of a tensor over ranks, for display of losses (not used for gradients)."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    t = tensor.detach().clone()
    dist.all_reduce(t)
    return t / get_world_size()


def broadcast_state(model, src=0):
    """Overwrite every rank's parameters and buffers with rank `src`'s, in place; a no-op when single.

    Before sharded validation: the ranks' EMA models agree on parameters but not on BatchNorm buffers (each rank
    averages its own running statistics), and the final validation loads best.pt on rank 0 only.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return model
    with torch.no_grad():
        for t in model.state_dict().values():
            dist.broadcast(t, src=src)
    return model
