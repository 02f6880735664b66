"""GPUs (home): the live device table, utilization history and the device picker."""

from __future__ import annotations

import gc
import threading
from typing import TYPE_CHECKING, ClassVar

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Footer, Header, Static
from textual.worker import get_current_worker

from xl.tui.screens.base import XLScreen
from xl.tui.selection import DeviceSelection, selection_warnings
from xl.tui.widgets.gpu_history import GPUHistory
from xl.tui.widgets.gpu_table import GPUTable

if TYPE_CHECKING:
    from xl.gpu.inventory import GPU
    from xl.gpu.nvml import Inventory

NO_GPU_TEXT = """[b]No NVIDIA GPU is visible on this machine.[/b]
{reason}

What still works here:
  • [b]Launch[/b] (3): runs train on CPU, one process per rank, with the gloo backend.
  • [b]Doctor[/b] (2): checks the CUDA toolkit, nvcc, the host compiler, torch and the environment.
  • [b]Runs[/b] (4): past and running runs, and their monitor.
"""


ORDER = Binding.Group("Order", compact=True)


def _reason(inv: Inventory | None) -> str:
    err = inv.driver.error if inv is not None else None
    return f"NVML says: {err}" if err else "NVML reports no GPUs."


def _freeze_heap() -> None:
    # The app's startup objects (widgets, styles, imported modules) live as long as the app; left
    # in the collector's generations, every full collection walks them all again, which on this
    # once-a-second screen was about a tenth of its CPU.
    gc.freeze()


class GPUsScreen(XLScreen):
    """The machine's GPUs, live (1 s), and which of them the next run uses, in which order."""

    AUTO_FOCUS = "#gpu-table"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "pick", "Use/skip"),
        # One footer entry for both ("⇧↑⇧↓ Order"): the footer must fit 80 columns.
        Binding("shift+up,K", "move(-1)", "Earlier", key_display="⇧↑", group=ORDER),
        Binding("shift+down,J", "move(1)", "Later", key_display="⇧↓", group=ORDER),
        Binding("c", "clear", "Clear"),
        Binding(
            "L", "launch", "Launch…", priority=True
        ),  # as the screen keys (tui/app.py): typed on at once
    ]

    class Polled(Message):
        def __init__(self, inventory: Inventory | None, error: str | None) -> None:
            super().__init__()
            self.inventory = inventory
            self.error = error

    def __init__(self, selection: DeviceSelection, *, interval: float = 1.0) -> None:
        super().__init__(id="gpus")
        self.selection = selection
        self.interval = interval
        self.gpus: tuple[GPU, ...] = ()
        self._active = True
        self._polls = 0
        self._shown: tuple[str, str] | None = None
        self._stopped = False
        self._no_gpu_text = ""
        self._wake = threading.Event()

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="gpu-main"):
            yield GPUTable(id="gpu-table")
            with Horizontal(id="gpu-lower"):
                yield GPUHistory(id="gpu-history")
                # Scrolls: at 80x24 the warnings can outgrow it, and a scrollbar says there is more.
                with VerticalScroll(id="pick-panel"):
                    yield Static("", id="cvd")
                    yield Static("", id="pick-warnings")
                    with Horizontal(id="pick-buttons"):
                        yield Button("Use/skip", id="btn-toggle")
                        yield Button("▲", id="btn-up", tooltip="Earlier in the order")
                        yield Button("▼", id="btn-down", tooltip="Later in the order")
                        yield Button("Launch…", id="btn-launch", variant="primary")
        yield Static("Reading the GPUs…", id="no-gpu")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "xl — GPUs"
        self.query_one("#gpu-main").display = False
        self._poller()

    def on_unmount(self) -> None:
        self._stopped = True
        self._wake.set()

    def on_screen_suspend(self) -> None:
        # Nobody sees the table: stop polling NVML until the screen comes back.
        self._active = False

    def on_screen_resume(self) -> None:
        if self.gpus:  # Launch's GPUs field may have changed the selection: show it now
            self._show_selection()
        if not self._active:
            self._active = True
            self._wake.set()

    @work(thread=True, exclusive=True, group="gpus-poll")
    def _poller(self) -> None:
        # One thread for the screen's life, not a worker per poll: a worker costs a thread-pool job
        # and a few Worker.StateChanged messages each time, which at 1 Hz is a visible part of an
        # idle screen.
        worker = get_current_worker()
        while not (self._stopped or worker.is_cancelled):
            if self._active:
                try:
                    message = self.Polled(self.backend.inventory(), None)
                except (
                    Exception
                ) as exc:  # NVML wrappers never raise; this is a missing module or a bug
                    message = self.Polled(None, f"{type(exc).__name__}: {exc}")
                self.post_message(message)
            # Suspended: sleep until resumed (or unmounted) instead of waking every interval.
            self._wake.wait(self.interval if self._active else None)
            self._wake.clear()

    def on_gpus_screen_polled(self, message: Polled) -> None:
        self._polls += 1
        inv = message.inventory
        self.gpus = inv.gpus if inv is not None else ()
        main = self.query_one("#gpu-main")
        panel = self.query_one("#no-gpu", Static)
        if not self.gpus:
            main.display = False
            panel.display = True
            text = NO_GPU_TEXT.format(reason=message.error or _reason(inv))
            if text != self._no_gpu_text:
                self._no_gpu_text = text
                panel.update(text)
        else:
            panel.display = False
            main.display = True
            if (
                self.focused is None
            ):  # hidden until the first poll, so not focused when the screen opened
                self.query_one(GPUTable).focus()
            self.selection.prune(g.index for g in self.gpus)
            self.query_one(GPUHistory).update_gpus(self.gpus)
            self._show_selection()
            if self._polls == 1:
                self.call_after_refresh(_freeze_heap)

    def _show_selection(self) -> None:
        spec = self.selection.gpus_spec
        if self.selection.other:
            # Typed in Launch's GPUs field and not a list of indices: the launcher resolves it.
            text = (f"The launch uses [b]--gpus {escape(spec)}[/b] (set in "
                f"Launch).\nspace/enter/click a row to pick GPUs instead.")
        elif spec:
            text = f"CUDA_VISIBLE_DEVICES=[b]{spec}[/b]  (CUDA_DEVICE_ORDER=PCI_BUS_ID)\n"
            text += "  ".join(
                f"LOCAL_RANK {k} → GPU {i}" for k, i in enumerate(self.selection.order)
            )
        else:
            text = ("No GPU picked: the launch uses every GPU.\nspace/enter/click a row to pick "
                "GPUs; shift+↑/↓ to order them.")
        warnings = "\n".join(f"⚠ {w}" for w in selection_warnings(self.gpus, self.selection.order))
        # Only touch the panel when its text changes: an update re-lays out these auto-height boxes.
        if (text, warnings) != self._shown:
            self._shown = (text, warnings)
            self.query_one("#cvd", Static).update(text)
            self.query_one("#pick-warnings", Static).update(warnings)
        self.query_one(GPUTable).update_gpus(self.gpus, self.selection.order)

    def _cursor(self) -> int | None:
        return self.query_one(GPUTable).cursor_index()

    @on(GPUTable.Toggled)
    def _toggled(self, message: GPUTable.Toggled) -> None:
        self.selection.toggle(message.index)
        self._show_selection()

    def action_pick(self) -> None:
        index = self._cursor()
        if index is not None:
            self.selection.toggle(index)
            self._show_selection()

    def action_move(self, delta: int) -> None:
        index = self._cursor()
        if index is not None and self.selection.move(index, delta):
            self._show_selection()

    def action_clear(self) -> None:
        self.selection.clear()
        self._show_selection()

    async def action_launch(self) -> None:
        await self.xl.action_screen("launch")

    @on(Button.Pressed, "#btn-toggle")
    def _btn_toggle(self) -> None:
        self.action_pick()

    @on(Button.Pressed, "#btn-up")
    def _btn_up(self) -> None:
        self.action_move(-1)

    @on(Button.Pressed, "#btn-down")
    def _btn_down(self) -> None:
        self.action_move(1)

    @on(Button.Pressed, "#btn-launch")
    async def _btn_launch(self) -> None:
        await self.action_launch()
