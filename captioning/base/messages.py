"""Messages on one line: an error as one line of output, with control characters escaped, so that a file name
holding them cannot forge a line of output or a terminal escape sequence. The commands' errors (cli.py) and the
library's own lines (reports, the demo server's log) go through here.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with its control characters escaped (a newline as `\\n`, ESC as `\\x1b`...): a file name that holds
    them cannot forge a line of output or a terminal escape sequence."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line(err: BaseException | str) -> str:
    """An error message on one line (a multi-line message, e.g. a ConfigError's list, joined with '; '), with any
    other control character escaped (see printable)."""
    text = str(err) if not isinstance(err, BaseException) or str(err) else type(err).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return printable("; ".join(lines).replace(":;", ":"))
