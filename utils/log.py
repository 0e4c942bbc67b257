"""The project's one logger, `yolo`: every module imports LOGGER from here; set_logging gives rank 0 the INFO lines
and the other ranks only warnings, in text any terminal takes."""

import logging
import sys

from utils.text import escape_controls

LOGGER = logging.getLogger("yolo")


class PrintableFormatter(logging.Formatter):
    """Messages as text any terminal takes: a file name that is not UTF-8 (held by Python as surrogate escapes, e.g.
    a Latin-1 'caf\\xe9.jpg') is shown with its bytes escaped, where a strict UTF-8 stdout would refuse the line, and
    control characters are escaped, line breaks inside the message included: whatever a file or class name holds,
    it can neither drive the terminal nor start a line of its own ('All checks passed'). Only the blank lines a
    message starts or ends with are kept; a message of several lines is logged a line at a time."""

    def format(self, record):
        text = super().format(record).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        body = text.strip("\n")
        if not body:
            return text
        start = text.index(body)
        return text[:start] + escape_controls(body) + text[start + len(body):]


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is when a record comes, not to the stream it was at set-up: a caller that swaps
    it (a notebook, contextlib.redirect_stdout, a test's capture that is closed afterwards) gets the later lines."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _):
        pass


def set_logging(rank=-1, verbose=True):
    """INFO on rank 0 (or single process, rank -1), WARNING elsewhere, so N ranks do not print N copies."""
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    if not LOGGER.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(PrintableFormatter("%(message)s"))
        LOGGER.addHandler(handler)
        LOGGER.propagate = False
    LOGGER.setLevel(level)
    return LOGGER
