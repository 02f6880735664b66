"""Text from ranks or peers, made safe to show on a person's terminal (docs/security.md).

A rank prints anything, and a peer sends anything: an escape sequence in it is a command to the
terminal that shows it (OSC 52 writes the clipboard, OSC 0 the window title, CSI moves the
cursor over xl's own lines). So every place that shows such text to a terminal passes it through
``visible``, which, like Textual's Log widget, draws each control character as a visible glyph
instead of sending it: ESC becomes "␛", a carriage return "␍", a C1 control "<9b>". The run dir
keeps the raw bytes; only what is shown is changed. Linear in the text, stdlib only.
"""

from __future__ import annotations

import re
from typing import BinaryIO, TextIO, cast

# C0 controls as their Unicode "control pictures" (U+2400 + code), DEL as U+2421, C1 controls
# (U+0080-U+009F: a terminal reads U+009B as CSI) and the bidi overrides that reorder what is
# shown (U+202A-U+202E, U+2066-U+2069) by their code.
_TABLE: dict[int, str] = {code: chr(0x2400 + code) for code in range(0x20)}
_TABLE[0x7F] = "\u2421"
_TABLE.update({code: f"<{code:02x}>" for code in range(0x80, 0xA0)})
_TABLE.update(
    {code: f"<U+{code:04X}>" for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
)
_TABLE[0x09] = "\t"  # a tab only moves the cursor right
_LINES = {**_TABLE, 0x0A: "\n"}


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character drawn, not sent; ``lines``: newlines kept as such
    (a traceback), else drawn too (one table cell, one event line)."""
    return text.translate(_LINES if lines else _TABLE)


class VisibleWriter:
    """A text stream that shows what it is given with ``visible`` (newlines kept)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(visible(text, lines=True))

    def flush(self) -> None:
        self._stream.flush()


def for_terminal(stream: TextIO) -> TextIO:
    """``stream`` itself when it is a file or pipe (the bytes as they are); a VisibleWriter on
    it when a person's terminal reads it."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return cast(TextIO, VisibleWriter(stream)) if tty else stream


# The same for bytes (a log copied as it is, in chunks): C0 controls but newline and tab, DEL,
# and the UTF-8 form of the C1 controls.
_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def _draw(match: re.Match[bytes]) -> bytes:
    return visible(match.group().decode("utf-8")).encode()


class VisibleBytesWriter:
    """A binary stream that shows what it is given with control characters drawn."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def write(self, data: bytes) -> int:
        self._stream.write(_CONTROL_BYTES.sub(_draw, data))
        return len(data)

    def flush(self) -> None:
        self._stream.flush()


def bytes_for_terminal(stream: BinaryIO) -> BinaryIO:
    """``for_terminal`` for a binary stream (``sys.stdout.buffer``)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return cast(BinaryIO, VisibleBytesWriter(stream)) if tty else stream
