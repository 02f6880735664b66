"""Launch: a form for one run, validated as it is typed, with the equivalent `xl launch` command."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Collapsible, Footer, Header, Input, Label, Select, Static

from xl.errors import UsageError
from xl.tui import settings
from xl.tui.launchform import MIXED_PRECISION, LaunchForm, command, to_spec
from xl.tui.screens.base import XLScreen
from xl.tui.selection import DeviceSelection

if TYPE_CHECKING:
    from xl.launcher.plan import Plan
    from xl.launcher.spec import LaunchSpec

TEXT_FIELDS = ("target", "args", "gpus", "nproc", "nnodes", "node_rank", "rdzv", "env", "name")
# What a script's memory fills in (settings.remember): each belongs to the script in Script.
SCRIPT_FIELDS = ("args", "gpus", "nproc", "mixed_precision", "env", "name")
LABELS = {
    "args": "Args",
    "gpus": "GPUs",
    "nproc": "Processes/node",
    "mixed_precision": "Mixed precision",
    "env": "Env",
    "name": "Name",
}
BLANK = LaunchForm()
# Terminal rows below which the fields drop their borders: the bordered form (three rows a
# field) needs 33 with the header, the summary and the footer.
COMPACT_BELOW = 34


class LaunchScreen(XLScreen):
    # Opens in its first field, ready to type; esc leaves a field so the screen keys work again.
    AUTO_FOCUS = "#target"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "launch", "Launch", priority=True),
        Binding("ctrl+y", "copy", "Copy", priority=True),
        Binding("escape", "leave_field", "Leave field"),
        # Priority, as the screen keys (tui/app.py): taken in the order typed. Left to bubble up
        # from the field, the focus moved only after the keys typed right after tab had gone to
        # the field before it ("train.py<tab>lr=0.1" became "train.pylr=0.1").
        Binding("tab", "app.focus_next", "Next field", show=False, priority=True),
        Binding("shift+tab", "app.focus_previous", "Previous field", show=False, priority=True),
    ]

    class Started(Message):
        def __init__(
            self, run_dir: Path | None, error: str | None, notice: str | None = None
        ) -> None:
            super().__init__()
            self.run_dir = run_dir
            self.error = error
            self.notice = notice

    def __init__(self, selection: DeviceSelection) -> None:
        super().__init__(id="launch")
        self.selection = selection
        self.valid = False
        self._filling = False
        self._launching = False
        # What the form says now, as its last validation planned it (None: it cannot run): the
        # plan shown is the plan started.
        self._ready: tuple[LaunchSpec, Plan] | None = None
        last = settings.last_target()
        saved = settings.recall(last) if last else None
        self.initial = LaunchForm.recalled(saved) if saved else LaunchForm()
        self._loaded_key = self.initial.key  # whose remembered settings the form holds
        # The values a script's memory put in its fields, as put: they belong to that script and
        # leave with it (a field changed since is the person's and stays).
        self._recalled: dict[str, str] = (
            {name: getattr(self.initial, name) for name in SCRIPT_FIELDS} if saved else {}
        )
        # The GPUs field is the GPUs screen's pick (every GPU when none): opening the form changes
        # no pick. A remembered launch's GPUs come back when its script is typed (recall).
        self.initial.gpus = selection.gpus_spec
        self._recalled.pop("gpus", None)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with VerticalScroll(id="launch-form"):
            yield from self._row("Script", "target", "train.py   or   -m package.module")
            yield from self._row("Args", "args", "--epochs 3 --lr 1e-4")
            yield from self._row("GPUs", "gpus", "from the GPUs screen, e.g. 2,0 (empty: all)")
            yield from self._row("Processes/node", "nproc", "one per GPU")
            with Horizontal(classes="form-row"):
                yield Label("Mixed precision", classes="form-label")
                yield Select(
                    [(m, m) for m in MIXED_PRECISION],
                    value=self.initial.mixed_precision
                    if self.initial.mixed_precision in MIXED_PRECISION
                    else "no",
                    allow_blank=False,
                    id="mixed_precision",
                )
                # All it does: a script that is not Accelerate's never reads the variable.
                yield Label(
                    "Accelerate only: sets ACCELERATE_MIXED_PRECISION", classes="form-hint"
                )
            yield from self._row("Env", "env", "KEY=VALUE KEY2=VALUE2")
            yield from self._row("Name", "name", "optional run name")
            with Collapsible(
                title="Nodes and rendezvous (multi-node)", collapsed=True, id="advanced"
            ):
                yield from self._row("Nodes", "nnodes", "1")
                yield from self._row("Node rank", "node_rank", "0")
                yield from self._row("Rendezvous", "rdzv", "HOST:PORT of node 0")
        # Outside the scrolling form: the verdict and the command stay visible at 80x24.
        with Vertical(id="launch-summary"):
            yield Static("", id="launch-validation")
            with Horizontal(id="launch-command-row"):
                yield Static("", id="launch-command")
                yield Button("Launch", id="btn-launch", variant="primary")
        yield Footer()

    def _row(self, label: str, field: str, placeholder: str) -> ComposeResult:
        with Horizontal(classes="form-row"):
            yield Label(label, classes="form-label")
            yield Input(getattr(self.initial, field), placeholder=placeholder, id=field)

    def on_resize(self) -> None:
        # Fields without their borders when the terminal is short: at 80x24 the whole form fits
        # with no scrollbar (whose thumb read as a stray "▄▄" beside Mixed precision).
        compact = self.size.height < COMPACT_BELOW
        self.set_class(compact, "-compact")
        for field in self.query("#launch-form Input").results(Input):
            field.compact = compact
        for choice in self.query("#launch-form Select").results(Select):
            choice.compact = compact

    def on_mount(self) -> None:
        self.title = "xl — Launch"
        self.query_one(
            "#launch-command", Static
        ).border_title = "equivalent command (ctrl+y copies)"
        # A field the person changes is theirs from that moment: watched as its value is set, not
        # from its Changed message, which a Script change queued before it may precede (and
        # that change takes the old script's values away).
        for name in SCRIPT_FIELDS:
            field = self.query_one(f"#{name}", Select if name == "mixed_precision" else Input)
            self.watch(field, "value", self._typed(name), init=False)
        self.validate()

    def _typed(self, name: str) -> Callable[[], None]:
        def typed() -> None:
            if not self._filling:
                self._recalled.pop(name, None)

        return typed

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "leave_field":
            return isinstance(self.focused, (Input, Select))  # shown in the footer only in a field
        return True

    def action_leave_field(self) -> None:
        # The form (not a field) holds the focus: keys reach the screen, tab goes back in.
        self.query_one("#launch-form").focus()

    def on_descendant_focus(self) -> None:
        self.refresh_bindings()  # "esc Leave field" comes and goes with the field

    def on_descendant_blur(self) -> None:
        self.refresh_bindings()

    def on_screen_resume(self) -> None:
        # The GPUs screen may have changed the selection (picked, reordered, cleared).
        field = self.query_one("#gpus", Input)
        if field.value.strip() != self.selection.gpus_spec:
            self._filling = True
            try:
                field.value = self.selection.gpus_spec
            finally:
                self._filling = False
            self.validate()

    def _value(self, name: str) -> str:
        if name == "mixed_precision":
            mp = self.query_one("#mixed_precision", Select).value
            return str(mp) if isinstance(mp, str) else "no"
        return self.query_one(f"#{name}", Input).value

    def _put(self, name: str, value: str) -> None:
        self._filling = True
        try:
            with self.prevent(Input.Changed, Select.Changed):
                if name == "mixed_precision":
                    self.query_one("#mixed_precision", Select).value = (
                        value if value in MIXED_PRECISION else "no"
                    )
                else:
                    self.query_one(f"#{name}", Input).value = value
            if name == "gpus":
                self.selection.set_spec(value)  # one selection: the picker shows it too
        finally:
            self._filling = False

    def _still_recalled(self) -> list[str]:
        """The fields that still hold what the script's memory put there (and say something)."""
        return [
            n for n, v in self._recalled.items() if self._value(n) == v and v != getattr(BLANK, n)
        ]

    def recall(self, key: str, form: LaunchForm | None) -> None:
        """Script now names ``key``, remembered as ``form`` (None: not remembered). What the last
        script's memory put in the fields and nobody changed since goes back to blank; then
        ``key``'s own settings fill the fields that are blank or were the last script's. The
        person's own values stay, and so does what they type in Script."""
        ours = set(self._still_recalled()) | {
            n for n in SCRIPT_FIELDS if self._value(n) == getattr(BLANK, n)
        }
        if "gpus" in ours and self.selection.gpus_spec != self._value("gpus"):
            ours.discard("gpus")  # picked since on the GPUs screen: the person's
        for name in self._still_recalled():
            self._put(name, getattr(BLANK, name))
        self._loaded_key = key
        self._recalled = {}
        if form is not None:
            for name in SCRIPT_FIELDS:
                if name in ours:
                    self._put(name, getattr(form, name))
                    self._recalled[name] = self._value(name)
        self.validate()

    def form(self) -> LaunchForm:
        values = {name: self.query_one(f"#{name}", Input).value for name in TEXT_FIELDS}
        mp = self.query_one("#mixed_precision", Select).value
        return LaunchForm(mixed_precision=str(mp) if isinstance(mp, str) else "no", **values)

    def validate(self) -> bool:
        form = self.form()
        argv = command(form)
        self.query_one("#launch-command", Static).update(Text(shlex.join(argv), style="bold"))
        out = self.query_one("#launch-validation", Static)
        self._ready = None
        try:
            spec = to_spec(form)
            plan = self.backend.plan(spec)
        except UsageError as exc:
            self.valid = False
            out.update(Text(f"✗ {exc}", style="bold red") + self._memory_note())
            out.set_class(True, "invalid")
            return False
        except ImportError as exc:
            self.valid = False
            out.update(Text(f"✗ the launcher is not available: {exc}", style="bold red"))
            return False
        self.valid = True
        self._ready = (spec, plan)
        out.set_class(False, "invalid")
        cvd = plan.env.get("CUDA_VISIBLE_DEVICES")
        where = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd else "CPU (gloo)"
        ready = f"✓ ready: {plan.nproc} process(es) per node on {where}"
        if spec.nnodes > 1:
            # Said here, not only in the collapsed section below: this launch waits for the others.
            ready += (f"; node {spec.node_rank} of {spec.nnodes}, waits for the others at "
                f"{spec.rdzv or 'node 0'}")
        out.update(Text(ready, style="green") + self._memory_note())
        return True

    def _memory_note(self) -> Text:
        """Says which fields hold the script's remembered settings: they come and go with it."""
        shown = self._still_recalled() if self.is_mounted else []
        if not shown:
            return Text()
        names = ", ".join(LABELS[n] for n in SCRIPT_FIELDS if n in shown)
        return Text(f"\n  {names}: as {self._loaded_key} was last launched", style="dim")

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self) -> None:
        if not self._filling:
            self.validate()

    @on(Input.Changed, "#gpus")
    def _gpus_changed(self, event: Input.Changed) -> None:
        # Typed here, picked on the GPUs screen: the same selection.
        if not self._filling:
            self.selection.set_spec(event.value)

    @on(Input.Changed, "#target")
    def _target_changed(self, event: Input.Changed) -> None:
        # Typing a script that was launched before brings back its last settings.
        if self._filling:
            return
        key = event.value.strip()
        if key == self._loaded_key:
            return
        saved = settings.recall(key) if key else None
        self.recall(key, LaunchForm.recalled(saved) if saved else None)

    def action_copy(self) -> None:
        argv = command(self.form())
        self.app.copy_to_clipboard(shlex.join(argv))
        self.notify("Command copied to the clipboard (OSC 52)")

    @on(Button.Pressed, "#btn-launch")
    def action_launch(self) -> None:
        if self._launching or not self.validate() or self._ready is None:
            if not self.valid:
                self.notify("Fix the form first: see the red line above", severity="error")
            return
        spec, plan = self._ready  # what the form says now, as shown: planned once
        self._launching = True
        self._start(spec, plan, self.form())

    @work(thread=True, exclusive=True, group="launch")
    def _start(self, spec: LaunchSpec, plan: Plan, form: LaunchForm) -> None:
        try:
            handle, notice = self.backend.start(spec, plan)
            settings.remember(form.key, form.remembered())
            self.post_message(self.Started(handle.run_dir, None, notice))
        except UsageError as exc:
            self.post_message(self.Started(None, str(exc)))
        except OSError as exc:
            self.post_message(self.Started(None, f"could not start the run: {exc}"))

    def on_launch_screen_started(self, message: Started) -> None:
        self._launching = False
        if message.error or message.run_dir is None:
            self.notify(message.error or "the run did not start", severity="error", timeout=8)
            return
        # Back from the Monitor, no field has the focus: the screen keys (1-4, q) work at once.
        self.action_leave_field()
        self.xl.open_monitor(message.run_dir, message.notice)
