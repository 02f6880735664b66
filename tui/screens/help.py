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

**Screens**: `1` GPUs · `2` Doctor · `3` Launch · `4` Runs · `?` or `F1` this help · `q` quit.
These keys work on every screen, except while a text field has the focus: there letters and
digits type into it. `esc` leaves the field (then the keys work again); `tab` moves between fields.

**Ctrl-C**: in the monitor that `xl launch` or `xl demo` opened, it stops that run (as with
torchrun) and closes once the run has ended; a second Ctrl-C closes at once and leaves it
stopping. Anywhere else it quits, as `q` does. Neither `q` nor closing the terminal stops a run.

## GPUs
The machine's GPUs, refreshed every second. `space`/`enter`/click picks a GPU for the next run;
`shift+↑`/`shift+↓` (or `K`/`J`) moves it earlier or later: LOCAL_RANK *k* uses the *k*-th GPU.
The preview shows the `CUDA_VISIBLE_DEVICES` the run gets and warns about mixed models, busy GPUs and MIG.
`c` clears the pick (the run then uses every GPU); `L` opens Launch. The pick and Launch's
*GPUs* field are one choice: change either and the other shows it (at start: the last launch's).

## Doctor
Every setup check, worst first. Move to a check to read its detail and fix. `r` runs them again.

## Launch
Opens in the *Script* field. Script (or `-m module`), arguments, processes per node (default: one per picked GPU), precision,
extra variables; nodes and rendezvous under *multi-node*. The form is checked as you type and shows
the equivalent `xl launch` command (`ctrl+y` copies it). `ctrl+r` launches and opens the Monitor.
The last settings for each script are remembered.

## Runs
Past and running runs. `enter` or a click opens one in the Monitor.

## Monitor
Every rank live: step, samples/s, loss, GPU, state (straggler, stalled, failed…), charts and the
selected rank's log. `[`/`]` or ↑/↓ switch rank · `c` charts on/off · `s` stops the run (asks first) · `escape` back.
When a run hangs, a banner names the rank(s) the others wait for and where they are (a rank that
waits on them shows as "waiting"); `k` asks the selected rank for its stacks now (`r` asks again).
`d` leaves the run going: in `xl launch`, `xl demo` or `xl attach` it closes the monitor
(`xl attach RUN` comes back); on a run opened from Runs or Launch it goes back, as `escape` does.
Closing the terminal never stops a run.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)
