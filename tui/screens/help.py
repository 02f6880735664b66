"""Help: what each screen is for and its keys."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# xl

**Screens** (keys work everywhere): `1` GPUs · `2` Doctor · `3` Launch · `4` Runs · `?` this help · `q` quit

## GPUs
The machine's GPUs, refreshed every second. `space`/`enter`/click picks a GPU for the next run;
`shift+↑`/`shift+↓` (or `K`/`J`) moves it earlier or later: LOCAL_RANK *k* uses the *k*-th GPU.
The preview shows the `CUDA_VISIBLE_DEVICES` the run gets and warns about mixed models, busy GPUs and MIG.
`L` opens Launch with this pick.

## Doctor
Every setup check, worst first. Move to a check to read its detail and fix. `r` runs them again.

## Launch
Script (or `-m module`), arguments, processes per node (default: one per picked GPU), precision,
extra variables; nodes and rendezvous under *multi-node*. The form is checked as you type and shows
the equivalent `xl launch` command (`ctrl+y` copies it). `ctrl+r` launches and opens the Monitor.
The last settings for each script are remembered.

## Runs
Past and running runs. `enter` or a click opens one in the Monitor.

## Monitor
Every rank live: step, samples/s, loss, GPU, state (straggler, stalled, failed…), charts and the
selected rank's log. `[`/`]` or ↑/↓ switch rank · `c` charts on/off · `s` stops the run (asks first) ·
`d` detaches: the run keeps going, `xl attach RUN` comes back · `escape` back.
Closing the terminal never stops a run.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
