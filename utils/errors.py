"""Errors the user can fix, and the one way every script reports them.

Raise a `UserError` subclass where the mistake is detected, with a message that names the file or option and the
problem. A script's `if __name__ == "__main__":` line is `run_cli(main, parse_opt)` (utils/run.py): a UserError
becomes one `error: <message>` line on stderr and exit status 2, on every rank; any other exception is a bug in the
project and keeps its traceback. Each subclass is also a ValueError, so callers that catch ValueError keep working.
A user's stop (Ctrl-C, SIGTERM) ends with status 128 + the signal number and no traceback either (`Interrupted`).
Running out of memory (host or GPU) is reported the same way as a user error: the fix is in the command (a smaller
batch or image size), and a traceback would only bury the one line of torch's that says how much was asked for.
A rank whose collective fails because another process of the run ended (killed, crashed, its machine lost) says so
in one `error:` line and exits with status 1 once the launcher stops it: the process that ended first and the
launcher's summary say why, and its own traceback would only bury theirs.
"""

import re
import signal
import sys

from utils.text import escape_controls


class UserError(Exception):
    """Something the user can fix: an option, a file, a dataset, a model YAML or a checkpoint."""


class BadOption(UserError, ValueError):
    """A command-line option or hyperparameter has a value that cannot work (names the option)."""


class BadFile(UserError, ValueError):
    """A file the user named is missing, unreadable or malformed (names the file)."""


class BadDataset(UserError, ValueError):
    """A dataset YAML or dataset folder is malformed or missing (names the YAML or folder)."""


class BadModelYaml(UserError, ValueError):
    """A model YAML has an unknown module, a bad argument or a bad layer reference (names the YAML line)."""


class BadCheckpoint(UserError, ValueError):
    """A weights / last.pt file is truncated, not ours, or does not fit the run (names the file)."""


# how a collective or the launcher's store fails when the other end of its connection is gone: gloo's TCP pairs,
# the TCP store, NCCL's remote-error report
LOST_PEER = re.compile(r"(?:(?:Read|Write) error \[[^\]]*\]:\d+: )?(?:Connection (?:closed|reset) by peer"
                       r"(?: \[[^\]]*\]:\d+)?|Broken pipe)|remote process exited or there was a network error")
CPU_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"  # torch raises a bare RuntimeError on the host


def _torch():
    """torch where a script has imported it, else None: this module is imported before the options are parsed, and
    torch's import (seconds) would make --help wait; an error of torch's can only come once torch is imported."""
    return sys.modules.get("torch")


def _in_group():
    """Whether this process is in a torch.distributed process group."""
    torch = _torch()
    return torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized()


def is_out_of_memory(e):
    torch = _torch()
    return isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError)) or (
        isinstance(e, RuntimeError) and CPU_OUT_OF_MEMORY in str(e))


def out_of_memory(e):
    """The one line for running out of memory: what was being allocated (the first line of torch's or numpy's
    message), and what to change."""
    said = str(e).strip().splitlines()
    what = said[0][:300] if said else "no details"
    return (f"out of memory ({what}): the command needs more memory than this machine has; a smaller --batch-size "
            "or --img needs less")


def lost_peer(e):
    """What a failed collective says of the process it lost (`Connection closed by peer [host]:port`), or None when
    `e` is not such a failure of a running process group."""
    if not (isinstance(e, RuntimeError) and _in_group()):
        return None
    found = LOST_PEER.search(str(e))
    return found.group(0) if found else None


class Interrupted(BaseException):
    """The user stopped the command with a signal. A BaseException, as KeyboardInterrupt is, so that no `except
    Exception` on the way up mistakes it for a failure to recover from. `message` is what is left to say (the trainer
    has already said how to resume); the exit status is 128 + the signal number, as the shell reports a signal."""

    def __init__(self, signum=signal.SIGINT, message=""):
        super().__init__(message)
        self.code, self.message = 128 + int(signum), message


def report_user_error(e, file=None):
    """Print the one line a user sees for `e` (whatever a file name in it holds: its control characters, line
    breaks included, are escaped)."""
    text = str(e).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    print(f"error: {escape_controls(text)}", file=file or sys.stderr, flush=True)
