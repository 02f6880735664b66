"""Help (`?` or F1): the keys of the screen it was pressed on, then the few that work everywhere."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from xl.tui.run_outcome import FINISHED
from xl.tui.screens.monitor import MonitorScreen

GPUS = """\
# GPUs
The machine's GPUs, refreshed every second; each process is labelled with the run and rank it
belongs to.

- `space` / `enter` / click: pick a GPU for the next run, or drop it
- `shift+↑` / `shift+↓` (or `K` / `J`): move the picked GPU earlier or later: LOCAL_RANK *k* uses
  the *k*-th
- `c`: clear the pick (the run then uses every GPU)
- `L`: open Launch

The panel shows the `CUDA_VISIBLE_DEVICES` the run gets and warns about mixed models, busy GPUs
and MIG. The pick and Launch's *GPUs* field are one choice: change either and the other shows it.
"""

DOCTOR = """\
# Doctor
Every setup check, worst first. Move to a check to read its detail and fix.

- `↑` / `↓`: move between checks
- `r`: run every check again
"""

LAUNCH = """\
# Launch
A form for one run, checked as you type, with the equivalent `xl launch` command below it.

- type: the field with the cursor takes the keys (letters and digits too)
- `tab` / `shift+tab`: next / previous field
- `esc`: leave the field, so that the screen keys (`1`-`4`, `q`, `?`) work again
- `ctrl+r`: launch, and open the run's Monitor
- `ctrl+y`: copy the command

Script (or `-m module`) and Args, then GPUs (empty: every GPU), processes per node (empty: one
per GPU), mixed precision, extra variables and a name. A script's settings come back when you
type it again, except nodes and rendezvous: a multi-node setting is for one launch only.
"""

RUNS = """\
# Runs
Every run, newest first: status, id (what `xl attach` takes), start, duration, ranks, name.

- `↑` / `↓`: choose a run
- `enter` / click: open it in the Monitor
- `space`: mark the run, or unmark it (two at most)
- `c`: compare the two marked runs
- `r`: list again now (the list refreshes every 2 s)
"""

COMPARE = """\
# Compare
Two runs side by side: where each one's time went, and what differs between them.

- `r`: read both runs again
- `esc`: back to Runs
"""

STACKS = """\
# Stacks
Where every rank of the run is now, asked live; the verdict on top is the whole run's, whichever
rank is shown.

- `[` / `]`: show the previous / next rank
- `r`: ask every rank again
- `esc` or `k`: back to the Monitor
"""


BIG_RUN = """\
Past 64 ranks the Monitor leads with the outliers (the slowest ranks, slow nodes, every rank not \
running) and a row per node: its ranks stepping, its least advanced step, its ranks' min / median \
/ max step time, the phase its time goes to, and what is wrong there. A rank or node is called \
slow at 1.25 times the median rank's step time or more.

- `↑` / `↓`: choose a node (the log follows its first rank)
- `enter`: that node's ranks, one row each; `esc` back to the nodes
"""


def monitor_help(*, running: bool, standalone: bool, owns_run: bool, big: bool = False) -> str:
    keys = ["- `[` / `]` or `↑` / `↓`: choose the rank whose log (and chart line) is shown",
            "- `c`: charts on or off",
            "- the log shows the newest lines as they come; scrolled back (wheel, or `tab` to the "
            "log and `↑` / `pgup`), it stays where it is until scrolled to the end or `f`"]
    if running:
        keys += [
            "- `s`: stop the run (it asks first): SIGTERM to every rank, SIGKILL after a grace "
            "period",
            "- `k`: ask every rank where it is now and show the chosen one's stacks",
            "- `d`: leave the run going: "
            + (
                "closes the monitor (`xl attach RUN` comes back)"
                if standalone or owns_run
                else "back, as `esc`"
            ),
        ]
    if not standalone:
        keys.append("- `esc`: back to the screen before")
    if owns_run and running:
        keys.append(
            "- `ctrl+c`: stop this run, as torchrun does, and close once it ended; a second "
            "`ctrl+c` closes at once and leaves it stopping"
        )
    text = (
        "# Monitor\nEvery rank of one run, live: step, loss, samples/s, GPU, state (straggler, "
        "stalled, failed…), charts and the chosen rank's log. When a run hangs, a banner names "
        "the rank(s) the others wait for; a straggler's banner names the phase it loses its time "
        "in.\n\nStep time: a rank's last step and its split, a letter a share: `d` waiting for "
        "data, `c` compute, `n` communication not hidden by compute, `o` the rest (the script's "
        "own code between steps). Memory: the rank's footprint (PSS, with its children) where "
        "known. Columns that do not fit the terminal are left out, least needed first.\n\n"
    )
    text += "\n".join(keys) + "\n"
    if big:
        text += "\n" + BIG_RUN
    if owns_run:
        text += (
            "\nWhen the run ends, this monitor (the one `xl launch` opened) closes after showing "
            "the outcome, which stays on the terminal; press any key first to keep it open.\n"
        )
    elif not running:
        text += "\nThe run has ended: nothing left to stop or detach from.\n"
    return text


def everywhere(*, standalone: bool, owns_run: bool, running: bool = False) -> str:
    if standalone:
        goes_on = " (the run goes on; `xl attach RUN` comes back)" if running else ""
        return f"\n**Everywhere**: `q` leaves the monitor{goes_on} · `?` or `F1` this help.\n"
    text = (
        "\n**Everywhere**: `1` GPUs · `2` Doctor · `3` Launch · `4` Runs · `?` or `F1` this help "
        "· `q` quit. In a text field these keys type into it: `esc` leaves the field first.\n"
    )
    if not owns_run:
        text += "`ctrl+c` quits, as `q` does. Neither stops a run.\n"
    return text


def help_for(screen: object, *, owns_run: bool) -> str:
    """The help of ``screen`` (the one `?` was pressed on); ``owns_run``: it is the Monitor of the
    run `xl launch` / `xl demo` started, where ctrl+c stops that run."""
    if isinstance(screen, MonitorScreen):
        running = screen.status not in FINISHED
        standalone = screen.standalone
        # Past 64 ranks: the nodes and outliers view (monitor_nodes.py) and its keys.
        body = monitor_help(
            running=running,
            standalone=standalone,
            owns_run=owns_run,
            big=screen.nodes_view.active,
        )
        return body + everywhere(standalone=standalone, owns_run=owns_run, running=running)
    kind = type(screen).__name__
    body = {
        "GPUsScreen": GPUS,
        "DoctorScreen": DOCTOR,
        "LaunchScreen": LAUNCH,
        "RunsScreen": RUNS,
        "StacksScreen": STACKS,
        "CompareScreen": COMPARE,
    }.get(kind, "# xl\n")
    if kind == "StacksScreen":
        return body  # a dialog: the app's keys wait until it is closed
    return body + everywhere(standalone=False, owns_run=owns_run)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark,f1", "close", "Close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(self.text)

    def action_close(self) -> None:
        self.dismiss(None)
