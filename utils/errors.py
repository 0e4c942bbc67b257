"""Errors the user can fix, and the one way every script reports them.

Raise a `UserError` subclass where the mistake is detected, with a message that names the file or option and the
problem. A script's `if __name__ == "__main__":` line is `run_cli(main, parse_opt)`: a UserError becomes one
`error: <message>` line on stderr and exit status 2, on every rank; any other exception is a bug in the project and
keeps its traceback. Each subclass is also a ValueError, so callers that catch ValueError keep working.
"""

import os
import sys


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


def report_user_error(e, file=None):
    """Print the one line a user sees for `e`."""
    print(f"error: {e}", file=file or sys.stderr, flush=True)


def run_cli(main, parse_opt):
    """`main(parse_opt())`, turning a UserError into `error: ...` and exit status 2.

    Under torchrun the process leaves at once with os._exit: a clean exit would destroy the process group and run
    atexit handlers, which can wait on peers that are blocked in a collective (or already gone). The launcher then
    stops the remaining ranks, so none hangs.
    """
    try:
        return main(parse_opt())
    except UserError as e:
        report_user_error(e)
        # utils.dist raises BadOption itself, so it is imported here, not at the top (an import cycle otherwise)
        from utils.dist import get_world_size

        if get_world_size() > 1:
            sys.stdout.flush()
            os._exit(2)
        sys.exit(2)
