"""torch and torchvision must be builds made for each other: torchvision's compiled operators (nms, roi_align) link
against one torch release and one CUDA (or CPU) build of it. pip checks only the version numbers, and a CPU torch
beside a CUDA torchvision of the same release (what pip installs when the CPU index cannot be reached) passes that
check, imports, and fails at the first NMS, an epoch into training, with `operator torchvision::nms does not exist`.
`check_torch_pair` finds that at the start of every script (utils/run.run_cli) and says which command fixes it.
"""

import importlib.machinery
import importlib.util
import re
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from utils.errors import UserError

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class BrokenInstall(UserError):
    """The installed packages cannot work together (names them and the command that fixes them)."""


def _release(version):
    """'2.14.1+cu130' -> (2, 14, 1), None when it does not read as a release."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(x or 0) for x in found.groups()) if found else None


def paired_torchvision(torch_version):
    """The torchvision release built for `torch_version` ('2.14.1+cpu' -> '0.29.1'): torch 2.N.p pairs with
    torchvision 0.(N+15).p, as every release since torch 2.0 / torchvision 0.15 has."""
    major, minor, patch = _release(torch_version) or (0, 0, 0)
    return f"0.{minor + 15}.{patch}" if major == 2 else None


def fix_command(torch_version):
    """The pip command that installs the torchvision made for this torch build: the CPU index for a `+cpu` torch, the
    CUDA index of a `+cuXYZ` one, PyPI (whose Linux wheels are the default CUDA build) otherwise."""
    wanted = paired_torchvision(torch_version)
    spec = f'"torchvision=={wanted}"' if wanted else "torchvision"
    local = torch_version.partition("+")[2]
    index = f" --index-url https://download.pytorch.org/whl/{local}" if re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", local) \
        else ""
    return f"pip install --force-reinstall --no-deps {spec}{index}"


def check_torch_pair():
    """BrokenInstall when torchvision is missing, of another release than torch's, or built for another torch build
    (its operators do not load). Imports torch, which every script does next anyway, and loads torchvision's
    operators without importing the package (`torchvision_nms`)."""
    import torch

    t = torch.__version__
    try:
        tv = metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        raise BrokenInstall(f"torchvision is not installed (torch {t} is): {fix_command(t)}") from None
    wanted = paired_torchvision(t)
    if wanted and _release(tv) != _release(wanted):
        raise BrokenInstall(f"torch {t} needs torchvision {wanted}, and {tv} is installed: {fix_command(t)}")
    why = _operators_missing()
    if why:
        raise BrokenInstall(f"torchvision {tv} was not built for torch {t} (this torch build cannot load its "
                            f"operators: {why}): {fix_command(t)}")


def _operators_missing():
    """Why torchvision's compiled operators cannot be used with this torch, or '' when they can."""
    try:
        torchvision_nms()
    except (ImportError, OSError, RuntimeError, AttributeError) as e:
        return " ".join(str(e).split())[:160]
    return ""


@lru_cache(maxsize=None)
def torchvision_nms():
    """torchvision's NMS op, `nms(boxes, scores, iou_thres) -> kept indices`, registered with torch by loading
    torchvision's compiled library: importing the torchvision package would also import torch._dynamo and its model
    zoo, 1.3-1.6 s of every command on a 2-core CPU (at every start, through `check_torch_pair`), for this one op
    (loading the library: 3 ms). Where the library is not found under a known name, or does not load, the package is
    imported (it registers the same op, and on Windows first adds the DLL folders it needs). Raises what a torchvision
    built for another torch raises: the library or the package fails to load, or the op is not registered."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    suffixes = dict.fromkeys([*importlib.machinery.EXTENSION_SUFFIXES, ".so"])
    libs = [folder / f"{name}{s}" for name in ("_C_stable", "_C") for s in suffixes] if folder else []
    lib = next((p for p in libs if p.is_file()), None)
    if lib is not None:
        try:
            torch.ops.load_library(str(lib))
            return torch.ops.torchvision.nms
        except (OSError, RuntimeError, AttributeError):
            pass
    import torchvision  # noqa: F401  (registers its operators with torch, or fails to)

    return torch.ops.torchvision.nms  # an operator that did not load raises here
