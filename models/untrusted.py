"""What an untrusted model file is and what it would make torch do, decided from its bytes before torch reads it.

Every `.pt` and `.torchscript` file is read into memory once; the checks here and torch's own reader then see the
same bytes (nothing can change on disk between the two), and the checks use torch's rules, not another library's:
- A file is a zip archive exactly when it starts with the zip magic (torch.serialization._is_zipfile). Its records
  are read with torch's own archive reader, and accepted only if their names are unique and their bytes are
  disjoint ranges inside the file, as torch.save and torch.jit.save write them (stored, not compressed): duplicate
  members, overlapping or oversized entries and compressed data, which could make two readers disagree or make
  torch allocate what the file does not hold, are refused. Appended bytes change nothing torch reads.
- Anything else is a pre-1.6 torch file (five pickles, then raw storage bytes) or not a checkpoint at all.
- A pickle is read statically (`scan_pickle`): the globals it names and the storages its persistent ids declare,
  followed through the stack and memo as torch's `weights_only` unpickler would build them. A storage may not
  claim more bytes than the file holds for it (its record, or the raw bytes of a pre-1.6 file), so nothing is
  allocated for a claim the file cannot back.
- TorchScript code is code: `check_torchscript` accepts only what export.py writes (traced `forward` methods of
  modules that call an allow-list of tensor operators), before torch.jit.load compiles or runs any of it.
"""

import ast
import io
import pickletools
import re
import reprlib
import zipfile
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from dataclasses import dataclass, field

import torch
import torch.serialization

from utils.budget import MAX_NESTING, MAX_PICKLE_BYTES, MAX_PICKLE_STACK
from utils.errors import BadCheckpoint, BadFile

ZIP_MAGIC = b"PK\x03\x04"  # torch.serialization._is_zipfile: the first four bytes decide, nothing else


class UnsafeCheckpoint(BadCheckpoint):
    """A file that would make torch run or allocate something no model checkpoint needs: refused before it does."""


class UnsafeTorchScript(BadFile):
    """A TorchScript file whose code export.py would not have written: refused before torch compiles it."""


# ------------------------------------------------------------------------------------------------ zip archives
class Archive:
    """A zip file as torch's reader (torch._C.PyTorchFileReader, what torch.load and torch.jit.load use) sees it.
    Record names are without the archive's top folder, as torch names them.

    torch's reader tells each record's offset and size but not how many bytes it occupies when compressed
    (torch.jit.save deflates its code), so Python's zipfile reads the central directory too, and each record must be
    the same entry for both (same local header). Only records `may_compress(name)` accepts may be compressed, and
    then to at most MAX_CODE_BYTES. Damage raises `error`, what torch.save and torch.jit.save never write `unsafe`."""

    MAX_CODE_BYTES = 16 << 20

    def __init__(self, data, label, error=BadCheckpoint, unsafe=UnsafeCheckpoint, may_compress=lambda name: False):
        try:
            self.reader = torch._C.PyTorchFileReader(io.BytesIO(data))
            names = self.reader.get_all_records()
            entries = {i.header_offset: i for i in zipfile.ZipFile(io.BytesIO(data)).infolist()}
            records = [(n, self.reader.get_record_header_offset(n), self.reader.get_record_offset(n),
                        self.reader.get_record_size(n)) for n in names]
        except (RuntimeError, zipfile.BadZipFile, ValueError) as e:
            what = "checkpoint" if issubclass(error, BadCheckpoint) else "TorchScript archive"
            raise error(f"{label}: not a readable {what} ({_first_line(e)})") from None
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise unsafe(f"refusing {label}: it holds two records named {dup!r}, which torch.save never writes "
                         "(two readers may pick different ones)")
        spans, self.sizes, self.label = [], {}, label
        for name, header, offset, size in records:
            entry = entries.get(header)
            if entry is None or entry.filename.partition("/")[2] != name or entry.file_size != size:
                raise unsafe(f"refusing {label}: its record {name!r} reads differently to torch and to zipfile "
                             "(a damaged or crafted archive)")
            stored = entry.compress_type == zipfile.ZIP_STORED and entry.compress_size == size
            if not stored and not (may_compress(name) and size <= self.MAX_CODE_BYTES):
                raise unsafe(f"refusing {label}: its record {name!r} is compressed, which torch.save never "
                             "writes")
            spans.append((offset, entry.compress_size, name))
            self.sizes[name] = size
        end = 0
        for offset, length, name in sorted(spans):
            if offset < end or offset + length > len(data):
                raise unsafe(f"refusing {label}: its record {name!r} claims bytes it does not hold "
                             "(overlapping another or beyond the end of the file)")
            end = offset + length

    def read(self, name):
        """The bytes of record `name`, read as torch reads them."""
        return self.reader.get_record(name)

    @property
    def is_torchscript(self):
        return "constants.pkl" in self.sizes or any(n.startswith("code/") for n in self.sizes)


def _first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# ------------------------------------------------------------------------------------------------ pickles
# the opcodes torch's weights_only unpickler (torch/_weights_only_unpickler.py) executes; it refuses every other
_TORCH_OPS = frozenset({
    "PROTO", "STOP", "GLOBAL", "NEWOBJ", "REDUCE", "BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "MARK",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWFALSE", "NEWTRUE", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT",
    "EMPTY_SET", "BININT", "BININT1", "BININT2", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "BINPERSID", "BINGET",
    "LONG_BINGET", "BINPUT", "LONG_BINPUT", "LONG1",
})
_CONSTANT_OPS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "STRING",
                 "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
                 "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8"}
_SINGLETONS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}
_MARK = object()  # the stack entry of MARK
_UNKNOWN = object()  # a value the scan does not follow (lists, dicts, objects built by calls)


class Global(str):
    """A global a pickle names, as `module.name`, on the scan's stack (PickleScan.globals holds plain strings)."""


class PickleTooCostly(ValueError):
    """A pickle larger, or keeping more values on its stack at once, than the budget (utils/budget.py) allows."""


@dataclass
class PickleScan:
    """What one pickle names and declares. `result` is the value it returns where the scan can follow it (a
    number, a string, a tuple of those), `end` the offset after its STOP. `calls` holds (callable, arguments) of
    every REDUCE and NEWOBJ, what torch's unpickler would call, as (opcode, callable, arguments): the callable a
    `Global` where the scan followed it, else _UNKNOWN; the arguments as far as followed (a tuple of constants,
    Globals and tuples, or _UNKNOWN)."""

    globals: list = field(default_factory=list)
    persistent_ids: list = field(default_factory=list)
    foreign_ops: list = field(default_factory=list)  # opcodes torch's restricted unpickler refuses
    calls: list = field(default_factory=list)
    depth: dict = field(default_factory=dict)  # id of a tuple built -> how deep it nests
    result: object = _UNKNOWN
    end: int = 0


def shown(value):
    """A followed pickle value for a message: what the scan did not follow as `...`."""
    if value is _UNKNOWN:
        return ...
    return tuple(shown(v) for v in value) if isinstance(value, tuple) else value


def _global_name(module, name):
    # Python 2 names (protocol 2, torch.save's default), mapped as torch's unpickler maps them
    module, name = NAME_MAPPING.get((module, name), (IMPORT_MAPPING.get(module, module), name))
    return Global(f"{module}.{name}")


def _pop_mark(stack):
    """The items above the last MARK; the MARK is removed."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise ValueError("pickle pops a MARK it never pushed")


def _generic(stack, op):
    """An opcode's effect on the stack shape (pickletools' description), its result not followed."""
    before = op.stack_before
    if pickletools.markobject in before:
        _pop_mark(stack)
        below = before.index(pickletools.markobject)
    else:
        below = len(before)
    if len(stack) < below:
        raise ValueError(f"pickle opcode {op.name} finds too few values on the stack")
    del stack[len(stack) - below:]
    stack.extend(_UNKNOWN for _ in op.stack_after)


def _step(op, arg, stack, memo, scan):
    """One opcode: values that can make up a global's name or a persistent id are followed exactly."""
    name = op.name
    if name in _CONSTANT_OPS:
        stack.append(arg)
    elif name in _SINGLETONS:
        stack.append(_SINGLETONS[name])
    elif name == "MARK":
        stack.append(_MARK)
    elif name in ("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"):
        n = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}.get(name)
        items = _pop_mark(stack) if n is None else [stack.pop() for _ in range(n)][::-1]
        stack.append(tuple(items))
        # tuples nest without growing the stack (TUPLE1 of TUPLE1 of ...): their depth is counted as they are built
        depth = scan.depth[id(stack[-1])] = 1 + max((scan.depth.get(id(i), 0) for i in items), default=0)
        if depth > MAX_NESTING:
            raise PickleTooCostly(f"its pickle nests tuples deeper than {MAX_NESTING} levels, which no checkpoint does")
    elif name == "GLOBAL":
        stack.append(_global_name(*arg.split(" ", 1)))
        scan.globals.append(str(stack[-1]))
    elif name == "STACK_GLOBAL":
        attr, module = stack.pop(), stack.pop()
        named = isinstance(module, str) and isinstance(attr, str)
        stack.append(_global_name(module, attr) if named else Global("an unnamed global (STACK_GLOBAL)"))
        scan.globals.append(str(stack[-1]))
    elif name == "INST":
        scan.globals.append(str(_global_name(*arg.split(" ", 1))))
        _generic(stack, op)
    elif name.startswith("EXT"):
        scan.globals.append(f"copyreg extension {arg}")
        stack.append(_UNKNOWN)
    elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
        memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
    elif name in ("GET", "BINGET", "LONG_BINGET"):
        stack.append(memo.get(arg, _UNKNOWN))
    elif name == "DUP":
        stack.append(stack[-1])
    elif name == "BINPERSID":
        scan.persistent_ids.append(stack.pop())
        stack.append(_UNKNOWN)
    elif name == "PERSID":
        scan.persistent_ids.append(arg)
        stack.append(_UNKNOWN)
    elif name == "STOP":
        scan.result = stack.pop() if stack else _UNKNOWN
    else:
        if name in ("REDUCE", "NEWOBJ") and len(stack) >= 2:
            scan.calls.append((name, stack[-2] if isinstance(stack[-2], Global) else _UNKNOWN, stack[-1]))
        _generic(stack, op)


def scan_pickle(f, max_bytes=MAX_PICKLE_BYTES):
    """Read one pickle from the binary file `f` without building anything (ValueError if it is not one,
    PickleTooCostly past `max_bytes` or MAX_PICKLE_STACK values on its stack: a million-deep nesting is refused at
    its 4097th level, before torch's unpickler builds any of it)."""
    scan, stack, memo = PickleScan(), [], {}
    start = f.tell()
    try:
        for op, arg, pos in pickletools.genops(f):
            if op.name not in _TORCH_OPS and op.name not in scan.foreign_ops:
                scan.foreign_ops.append(op.name)
            _step(op, arg, stack, memo, scan)
            if pos - start > max_bytes:
                raise PickleTooCostly(f"its pickle is larger than {max_bytes} bytes")
            if len(stack) > MAX_PICKLE_STACK:
                raise PickleTooCostly(f"its pickle keeps more than {MAX_PICKLE_STACK} values on its stack (nests "
                                      "deeper or builds longer than any checkpoint)")
    except IndexError:
        raise ValueError("pickle pops a value it never pushed") from None
    scan.end = f.tell()
    return scan


# ------------------------------------------------------------------------------------------------ storages
def _itemsize(storage_type):
    """Bytes per element of a storage class named in a persistent id, as torch derives it (None: not a storage)."""
    if storage_type == "torch.storage.UntypedStorage":
        return 1
    module, _, name = str(storage_type).rpartition(".")
    if not isinstance(storage_type, Global) or module not in ("torch", "torch.cuda") or not name.endswith("Storage"):
        return None
    try:
        return torch.serialization.StorageType(name).dtype.itemsize
    except (KeyError, AttributeError):
        return None


def _text(v):
    return v.decode("ascii", "replace") if isinstance(v, bytes) else v


def storage_claims(pids, label, legacy=False):
    """{storage key: bytes torch allocates for it} from a pickle's persistent ids (the first id of a key decides, as
    in torch). Zip pickles: ('storage', type, key, location, numel); pre-1.6 files add view metadata, and hold
    ('module', class, file, source) ids too, which torch's restricted unpickler cannot read."""
    claims = {}
    for pid in pids:
        kind = _text(pid[0]) if isinstance(pid, tuple) and pid else None
        if legacy and kind == "module":
            raise UnsafeCheckpoint(
                f"refusing {label}: it is a pre-1.6 torch file that pickles whole modules, which torch's restricted "
                "loader cannot read; re-save it as a zip file (torch.save with torch >= 1.6) in the environment that "
                "wrote it, where its code is trusted")
        size = len(pid) if isinstance(pid, tuple) else 0
        if kind != "storage" or size != (6 if legacy else 5):
            raise UnsafeCheckpoint(f"refusing {label}: it refers to external data torch would not read as a "
                                   f"storage ({reprlib.repr(pid)})")
        _, storage_type, key, _, numel = pid[:5]
        itemsize = _itemsize(storage_type)
        if itemsize is None or not isinstance(key, (str, bytes)) or type(numel) is not int or numel < 0:
            raise UnsafeCheckpoint(f"refusing {label}: it declares a storage torch cannot size ({reprlib.repr(pid)})")
        claims.setdefault(_text(key), numel * itemsize)
    return claims


def check_record_claims(archive, pickle_name, pids):
    """Each storage a pickle of `archive` declares must fit in its record: torch reads storage KEY of `X.pkl`
    from the record `X/KEY` (data.pkl -> data/0, constants.pkl -> constants/0)."""
    folder = pickle_name.removesuffix(".pkl")
    for key, nbytes in storage_claims(pids, archive.label).items():
        record = f"{folder}/{key}"
        if record not in archive.sizes:
            raise BadCheckpoint(f"{archive.label}: not a readable checkpoint (storage record {record} is missing)")
        if nbytes > archive.sizes[record]:
            raise UnsafeCheckpoint(f"refusing {archive.label}: its storage {record} claims {nbytes} bytes but the "
                                   f"file holds {archive.sizes[record]} for it")


# ------------------------------------------------------------------------------------------------ checkpoints
def _scan(data, label):
    try:
        return scan_pickle(io.BytesIO(data))
    except PickleTooCostly as e:
        raise UnsafeCheckpoint(f"refusing {label}: {e}") from None
    except ValueError as e:
        raise BadCheckpoint(f"{label}: not a readable checkpoint ({_first_line(e)})") from None


def _refuse_foreign_ops(scans, label):
    op = next((o for s in scans for o in s.foreign_ops), None)
    if op is not None:
        raise BadCheckpoint(f"{label}: not a readable checkpoint (pickle opcode {op}, which torch's restricted "
                            "loader does not read)")


def _legacy_scans(data, label):
    """The pickles at the start of a non-zip file: a pre-1.6 torch file has five (magic number, protocol, system
    info, the object, its storage keys), then raw storage bytes; a plain pickle has one."""
    f, scans = io.BytesIO(data), []
    while len(scans) < 5 and f.tell() < len(data):
        try:
            scans.append(scan_pickle(f))
        except PickleTooCostly as e:
            raise UnsafeCheckpoint(f"refusing {label}: {e}") from None
        except ValueError as e:
            if not scans:
                raise BadCheckpoint(f"{label}: not a readable checkpoint ({_first_line(e)})") from None
            break
    return scans


def _check_legacy(scans, size, label):
    """A pre-1.6 file: its layout, and its storages within the raw bytes after the pickles (torch allocates each
    storage while unpickling, before it reads the bytes)."""
    magic = torch.serialization.MAGIC_NUMBER, torch.serialization.PROTOCOL_VERSION
    if len(scans) < 5 or tuple(s.result for s in scans[:2]) != magic:
        raise BadCheckpoint(f"{label}: not a readable checkpoint (neither a zip archive nor a pre-1.6 torch file)")
    if any(s.persistent_ids for i, s in enumerate(scans) if i != 3):
        raise UnsafeCheckpoint(f"refusing {label}: a header pickle refers to external data")
    claims = storage_claims(scans[3].persistent_ids, label, legacy=True)
    need, room = sum(claims.values()) + 8 * len(claims), size - scans[4].end  # each storage: 8-byte count + bytes
    if need > room:
        raise UnsafeCheckpoint(f"refusing {label}: its storages claim {need} bytes but the file holds {room} after "
                               "its pickles")


def check_checkpoint(data, label, refuse_globals, refuse_calls=lambda calls: None):
    """Every check before torch.load(weights_only=True) reads `data`; returns the globals its pickle names.

    `refuse_globals(names)` raises for a global outside the caller's allow-list; it runs first, so a payload is
    refused by the name of what it reaches for. `refuse_calls(calls)` then judges what the unpickler would call and
    with which arguments (PickleScan.calls), before anything is built. A TorchScript archive is refused: it is code,
    not a checkpoint."""
    if data[:4] == ZIP_MAGIC:
        # code records may be compressed (as torch.jit.save writes them) so that a TorchScript archive is named as such
        archive = Archive(data, label, may_compress=lambda name: name.startswith("code/"))
        if archive.is_torchscript:
            raise UnsafeCheckpoint(f"refusing {label}: it is a TorchScript archive (code, not a checkpoint); give "
                                   "export.py's .torchscript file by that name, or the .pt it was exported from")
        if "data.pkl" not in archive.sizes:
            raise BadCheckpoint(f"{label}: not a readable checkpoint (a zip archive without data.pkl)")
        if archive.sizes["data.pkl"] > MAX_PICKLE_BYTES:
            raise UnsafeCheckpoint(f"refusing {label}: its data.pkl holds {archive.sizes['data.pkl']} bytes, more than "
                                   f"the {MAX_PICKLE_BYTES} of any checkpoint's")
        scan = _scan(archive.read("data.pkl"), label)
        refuse_globals(scan.globals)
        _refuse_foreign_ops([scan], label)
        refuse_calls(scan.calls)
        check_record_claims(archive, "data.pkl", scan.persistent_ids)
        return scan.globals
    scans = _legacy_scans(data, label)
    names = [g for s in scans for g in s.globals]
    refuse_globals(names)
    _refuse_foreign_ops(scans, label)
    refuse_calls([c for s in scans for c in s.calls])
    _check_legacy(scans, len(data), label)
    return names


# ------------------------------------------------------------------------------------------------ TorchScript
# What torch.jit.trace writes for every model export.py exports (YOLOv3/v5/v7/v8/11 detect, segment, classify, pose,
# with their attention, transformer, ghost and padded blocks, the attention series and Swin V2, static and dynamic,
# traced on the CPU in fp32): the tensor operators below, `annotate`/`getattr`/`int`/`float`, and `forward` methods
# of submodules. tests/models/test_untrusted.py and test_zoo_export.py export each family and fail when a new
# operator appears.
TORCHSCRIPT_OPS = frozenset({
    *(f"torch.{op}" for op in (
        "_convolution", "adaptive_avg_pool2d", "add", "arange", "bmm", "cat", "chunk", "contiguous", "device", "div",
        "dropout", "dropout_", "flatten", "full", "leaky_relu", "linear", "matmul", "max_pool2d", "meshgrid", "mul",
        "pad", "permute", "pow", "reshape", "select", "sigmoid", "silu", "size", "slice", "softmax", "split",
        "split_with_sizes", "stack", "sub", "to", "transpose", "unsqueeze", "upsample_nearest2d", "view",
        # the attention series and Swin V2 (models/attention.py, models/swin.py)
        "__or__", "abs", "amax", "clamp", "clamp_min", "exp", "expand_as", "fill_", "floor_divide", "ge", "gelu",
        "hardswish", "index", "layer_norm", "linalg_vector_norm", "log2", "mean", "ne", "neg", "ones_like", "relu",
        "relu_", "roll", "sign", "sum", "unbind", "where", "zeros", "zeros_like",
        "cos", "sin")),  # the oriented-box head
    "ops.prim.NumToTensor",
})
_TORCHSCRIPT_CALLS = frozenset({"annotate", "getattr", "int", "float"})
# a number in traced code: channel counts, strides, sizes of static exports (a 8192-px export's anchor count: 1.3 M);
# what the numbers make a graph allocate is then measured by its dry run (utils/dry_run.py)
MAX_TORCHSCRIPT_LITERAL = 1 << 24
_SLICE_END = (1 << 63) - 1  # what traced code writes for a slice to the end, `x[:, 2:]`
_TORCHSCRIPT_ROOTS = frozenset({"torch", "ops"})
_RESERVED = _TORCHSCRIPT_ROOTS | _TORCHSCRIPT_CALLS | {"CONSTANTS", "__torch__"}
_FORWARD = re.compile(r"forward\d*")
# the characters of traced code: no comments, escapes, other quotes, semicolons, tabs or non-ASCII, so that Python's
# parser (which reads the code here) and TorchScript's (which compiles it) cannot split it differently
_NOT_SOURCE = re.compile(r'[^A-Za-z0-9_ \n.,:()=\[\]"\->]')
_TORCHSCRIPT_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AnnAssign, ast.Assign, ast.Attribute, ast.Call,
                      ast.Constant, ast.List, ast.Load, ast.Name, ast.Return, ast.Store, ast.Subscript, ast.Tuple,
                      ast.UnaryOp, ast.USub, ast.arg, ast.arguments, ast.keyword)
# the globals of traced archives' pickles: tensors, their storages, containers, and the archive's own module classes
_TORCHSCRIPT_GLOBALS = re.compile(r"torch\._utils\._rebuild_tensor_v2|collections\.OrderedDict|torch\.\w+Storage"
                                  r"|torch\.jit\._pickle\.(build_intlist|restore_type_tag)|__torch__\.(?!torch\.classes\.).+")


# the records torch.jit.save writes for a traced module (anything else, e.g. model.json, would take torch.jit.load
# down another path: the pre-1.4 format reads tensors from sizes its JSON declares)
_TORCHSCRIPT_RECORDS = re.compile(r"(data|constants|traced_inputs)(\.pkl|/\d+)|version|byteorder|extra/[\w.-]+"
                                  r"|\.data/(version|serialization_id)|\.format_version|\.storage_alignment|code/.+")


def _dotted(node):
    """'torch.cat' for the expression torch.cat, None for anything that is not a chain of names."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *parts[::-1]]) if isinstance(node, ast.Name) else None


def _code_problem(tree):
    """Why parsed TorchScript code is not what a traced export writes, or None."""
    chain_roots = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if not isinstance(node, _TORCHSCRIPT_NODES):
            return f"a {type(node).__name__}, which traced exports never write"
        if isinstance(node, ast.ClassDef) and (node.decorator_list or [_dotted(b) for b in node.bases] != ["Module"]):
            return f"class {node.name}, which is not a plain traced module"
        if isinstance(node, ast.FunctionDef) and (node.decorator_list or not _FORWARD.fullmatch(node.name)):
            return f"a method {node.name}, where traced modules define only forward"
        if isinstance(node, ast.Name) and node.id in _RESERVED and (
                not isinstance(node.ctx, ast.Load) or (node.id in _TORCHSCRIPT_ROOTS and id(node) not in chain_roots)):
            return f"the name {node.id} used as a variable"
        if isinstance(node, ast.arg) and node.arg in _RESERVED:
            return f"the name {node.arg} used as an argument"
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not (
                abs(node.value) <= MAX_TORCHSCRIPT_LITERAL or node.value == _SLICE_END):  # nan too: `not <=`
            return f"the literal {node.value!r}, larger than any size or constant an export writes"
        if isinstance(node, ast.Attribute) and (_dotted(node) or "").split(".")[0] in _TORCHSCRIPT_ROOTS:
            name = _dotted(node)
            if name not in TORCHSCRIPT_OPS and not any(op.startswith(name + ".") for op in TORCHSCRIPT_OPS):
                return f"{name}, which is not among the operators export.py writes"
        if isinstance(node, ast.Call):
            func = node.func
            ok = (isinstance(func, ast.Name) and func.id in _TORCHSCRIPT_CALLS) or (
                isinstance(func, ast.Attribute) and (_FORWARD.fullmatch(func.attr) or _dotted(func) in TORCHSCRIPT_OPS))
            if not ok:
                return f"a call of {ast.unparse(func)[:60]}, which is not among the operators export.py writes"
    return None


def check_torchscript(data, label):
    """Refuse (UnsafeTorchScript) a TorchScript archive holding anything export.py would not write: code other than
    traced `forward` methods calling TORCHSCRIPT_OPS (a `__setstate__` would run while loading), pickles naming
    other globals, storages larger than their records. Nothing of the file runs here."""
    if data[:4] != ZIP_MAGIC:
        raise BadFile(f"{label}: not a TorchScript archive (export it with export.py)")
    archive = Archive(data, label, BadFile, UnsafeTorchScript, may_compress=lambda name: name.startswith("code/"))
    if not archive.is_torchscript:
        raise BadFile(f"{label}: not a TorchScript archive (export it with export.py)")
    odd = [n for n in archive.sizes if not _TORCHSCRIPT_RECORDS.fullmatch(n)]
    if odd or not {"data.pkl", "constants.pkl"} <= archive.sizes.keys():
        raise UnsafeTorchScript(f"refusing {label}: it holds {odd[:3] or 'no data.pkl and constants.pkl'}, unlike "
                                "what export.py writes")
    for name in archive.sizes:
        if name.startswith("code/") and name.endswith(".py"):
            source = archive.read(name).decode("latin-1")
            odd = _NOT_SOURCE.search(source)
            try:
                problem = f"the character {odd[0]!r}, which traced code never holds" if odd else _code_problem(
                    ast.parse(source))
            except (SyntaxError, ValueError) as e:
                problem = f"code that does not parse ({_first_line(e)})"
            if problem:
                raise UnsafeTorchScript(f"refusing {label}: its code {name} holds {problem}")
        elif name.startswith("code/") and not name.endswith(".py.debug_pkl"):
            raise UnsafeTorchScript(f"refusing {label}: its code folder holds {name}, which is not TorchScript source")
        elif name.endswith((".pkl", ".debug_pkl")):  # debug pickles too: torch.jit.load reads them
            _check_torchscript_pickle(archive, name, label)


def _check_torchscript_pickle(archive, name, label):
    try:
        scan = scan_pickle(io.BytesIO(archive.read(name)))
    except ValueError as e:
        raise BadFile(f"{label}: not a readable TorchScript archive ({name}: {_first_line(e)})") from None
    bad = next((g for g in scan.globals if not _TORCHSCRIPT_GLOBALS.fullmatch(g)), None)
    if bad is not None:
        raise UnsafeTorchScript(f"refusing {label}: its {name} references {bad}, which export.py never writes")
    if name in ("data.pkl", "constants.pkl"):  # what torch.jit.load unpickles (traced_inputs.pkl it never reads)
        try:
            check_record_claims(archive, name, scan.persistent_ids)
        except BadCheckpoint as e:
            raise UnsafeTorchScript(str(e)) from None
