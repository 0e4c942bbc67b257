"""Text that cannot drive a terminal: control characters of names and paths written as escapes, for every log line,
error line, drawn label and saved text."""

_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
_CONTROL.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def escape_controls(text):
    """`text` with its control characters (C0, DEL, C1: carriage returns, escape sequences, newlines) written as
    escapes ('\\x1b', '\\n'): a name in it can neither move a terminal's cursor, clear
    the screen, set a window title, nor start a line of its own. Bytes of a non-UTF-8 name are left as they are
    (files that write names back as their bytes)."""
    return str(text).translate(_CONTROL)


def has_controls(text):
    """Whether `text` holds a control character (a class name that would be printed escaped, not as it reads)."""
    return escape_controls(text) != str(text)
