"""Fine-tuning from another model: the tensors whose key and shape fit, and the head's slices of the classes both
models name alike."""

import torch

from models.checkpoints.load import attempt_load
from models.checkpoints.ours import class_names
from utils.log import LOGGER


def transfer_weights(model, src, name, exclude=("anchors", "anchor_grid")):
    """Copy every tensor of model `src` whose key and shape match `model` (the v5 fine-tuning rule); return the keys
    copied (whole or, in the head, in part).

    Anchors are left to the model YAML. Where the classes differ (another count or order), the head's class slices
    (its `class_rows`) are carried over for the classes both models name alike (`_shared_classes`), and the other
    classes start new.
    """
    dst, src_sd = model.state_dict(), src.float().state_dict()
    keep = {
        k: v for k, v in src_sd.items() if k in dst and v.shape == dst[k].shape and not any(e in k for e in exclude)
    }
    whole = len(keep)
    shared = _shared_classes(model, src, dst, src_sd, keep)
    model.load_state_dict(keep, strict=False)
    said = f"; in the head, the classes named alike: {', '.join(shared)}" if shared else ""
    LOGGER.info(f"Transferred {whole}/{len(dst)} items from {name}{said}")
    return set(keep)


def _shared_classes(model, src, dst, src_sd, keep):
    """Put in `keep` the head tensors of `model` with src's slices copied in for the classes both name alike (and
    the slices that mean the same for any class count, e.g. anchor boxes), the other classes left new, where the
    classes differ (another count, or another order) but every other dimension fits; returns those names. Nothing
    changes when no name is shared. dst, src_sd: the two models' state dicts."""
    head, src_head = model.model[-1], src.model[-1]
    if type(head) is not type(src_head) or not hasattr(head, "class_rows"):
        return []
    names, src_names = class_names(model.names, model.nc), class_names(src.names, src.nc)
    if names == src_names:
        return []  # the same classes in the same order: the head transferred whole, or has another shape
    by_name = {n: c for c, n in src_names.items()}
    pairs = [(c, by_name[n]) for c, n in sorted(names.items()) if n in by_name]
    if not pairs:
        return []
    prefix = f"model.{len(model.model) - 1}."
    ours, theirs = head.class_rows(), src_head.class_rows()
    tensors = {}
    for key, (dim, rows, fixed) in ours.items():
        k = prefix + key
        if k not in src_sd or key not in theirs:
            continue
        a, b = dst[k], src_sd[k]
        if a.dim() != b.dim() or any(x != y for d, (x, y) in enumerate(zip(a.shape, b.shape)) if d != dim):
            return []  # the rest of the head differs too: nothing of it carries over
        src_rows, src_fixed = theirs[key][1:]
        if len(fixed) != len(src_fixed):  # another number of anchors or mask coefficients
            return []
        copies = [(rows(c), src_rows(c_src)) for c, c_src in pairs] + ([(fixed, src_fixed)] if fixed else [])
        a = a.clone()
        for to, frm in copies:
            a.index_copy_(dim, torch.tensor(to), b.index_select(dim, torch.tensor(frm)))
        tensors[k] = a
    if not tensors:
        return []
    keep.update(tensors)
    return [names[c] for c, _ in pairs]


def load_pretrained(model, weights, exclude=("anchors", "anchor_grid")):
    """Seed `model` from a checkpoint file (ours or official) by `transfer_weights`."""
    return transfer_weights(model, attempt_load(weights, device="cpu", fuse=False), weights, exclude)
