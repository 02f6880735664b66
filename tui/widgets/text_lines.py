"""A few lines of rich Text that change every second (the Monitor's header and progress line).

A Static renders its Text again through Rich's console on every update and re-lays out the whole
screen by default. This one wraps the Text once per update (and width) into strips drawn through
the line API, and asks for a new layout only when the number of lines changes.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class TextLines(Widget):
    """Styled in tui/xl.tcss (``height: auto``: as many lines as the text wraps to)."""

    def __init__(self, text: Text | str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text(text) if isinstance(text, str) else text
        self._key = _key(self._text)
        self._strips: tuple[int, Any, list[Strip]] | None = None  # (width, base style, lines)

    @property
    def text(self) -> Text:
        return self._text

    def update(self, text: Text | str) -> None:
        text = Text(text) if isinstance(text, str) else text
        key = _key(text)
        if key == self._key:
            return
        before = len(self._lines(self.size.width)) if self.size.width else None
        self._text, self._key, self._strips = text, key, None
        after = len(self._lines(self.size.width)) if self.size.width else None
        self.refresh(layout=before != after)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines(width))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        lines = self._lines(width)
        base = self.visual_style.rich_style
        if y < len(lines):
            return lines[y].crop_extend(0, width, base)
        return Strip.blank(width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = None

    def _lines(self, width: int) -> list[Strip]:
        base = self.visual_style.rich_style if self.is_mounted else None
        if self._strips is not None and self._strips[0] == width and self._strips[1] == base:
            return self._strips[2]
        console = self.app.console
        lines = [
            Strip(text_segments(line, console, base))
            for line in self._text.wrap(console, max(1, width))
        ]
        self._strips = (width, base, lines)
        return lines


def text_segments(text: Text, console: Console, under: Style | None = None) -> list[Segment]:
    """One line of ``text`` as segments, its own style included (Text.render leaves the Text's
    base style to the caller: a state or a meter styled as a whole would lose its colour),
    over ``under``."""
    style = console.get_style(text.style) if text.style else None
    if under:
        style = under + style if style else under
    segments = text.render(console, end="")
    return [s for s in (Segment.apply_style(segments, style) if style else segments) if s.text]


def _key(text: Text) -> Any:
    return (text.plain, tuple(text.spans), str(text.style))
