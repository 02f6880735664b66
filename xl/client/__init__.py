"""The training-script side of telemetry: ``xl.log``, ``xl.watch``, ``xl.flush``.

``xl.log(**scalars)`` appends ``(time, scalars)`` to a bounded deque and returns: no I/O, no
locks, no conversion on the training thread. Everything else happens on the sender thread
(``xl.client.sender``): records (``records``), the connection to the collector, the spool
(``spool``) when it cannot be reached. ``xl.watch`` (``watch``) times DDP's all-reduce.

Nothing is lost: frames stay in memory until the collector acks them; when it can't be reached
they are spooled and replayed on reconnect (or stored by the supervisor once this process is
gone). If the queue ever fills because the sender is starved, calls are dropped and counted, and
the count reaches the run's events.

Outside an xl run (no ``XL_COLLECTOR``) every function is a no-op that costs a function call.
This package never imports doctor, launcher or tui, nor torch at module level.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from typing import Any, TypeVar

from xl import envnames
from xl.client.metricline import StepSource
from xl.client.sender import Sender

__all__ = ["active", "announce", "attach_steps", "flush", "log", "watch"]

M = TypeVar("M")  # the script's model, handed back as it came

EXIT_WAIT_S = 2.0

_sender: Sender | None = None


def active() -> bool:
    """True inside an xl run (the supervisor gave this process a collector)."""
    return _sender is not None


def _noop_log(*args: object, **scalars: object) -> None:
    return None


def _positional(args: tuple[object, ...], scalars: dict[str, object]) -> dict[str, object]:
    # xl.log({"loss": x}) (the wandb.log habit) works too: dicts are merged, keywords win.
    merged: dict[str, object] = {}
    for arg in args:
        if isinstance(arg, dict):
            merged.update((k, v) for k, v in arg.items() if isinstance(k, str))
    merged.update(scalars)
    return merged


def _make_log(sender: Sender) -> Any:
    # Everything the hot path touches is bound here once: a call is a length check and an append.
    queue = sender.queue
    append = queue.append
    now = time.time
    limit = sender.max_queue

    def log(*args: object, **scalars: object) -> None:
        """Record scalars for this rank (e.g. ``step``, ``loss``, ``samples``); returns at once."""
        if args:
            scalars = _positional(args, scalars)
        if len(queue) < limit:
            append((now(), scalars))
        else:
            sender.dropped += 1

    return log


def announce(*keys: str) -> None:
    """Say this rank reports its own train metrics (integrations call it before training), so
    the supervisor does not also parse the metrics the rank prints.

    ``keys``: the train keys (``step``, ``loss``, ``samples``) this rank gives itself from now
    on, before it has logged them: the steps torch's hooks report leave them out (a key given
    to ``xl.log`` counts too, from the call that gives it)."""
    sender = _sender
    if sender is not None:
        sender.own.announce(keys)
        sender.wake.set()


def attach_steps(source: StepSource, every: float = 0.0, hold: float = 0.0) -> bool:
    """Have the sender thread call ``source(given, final)`` at each wake-up for the scalars of one
    ``train`` line (``(t, scalars)`` or None): the steps torch's hooks counted since
    (``xl.integrations.stepclock``). ``every``: the wall-clock grid its lines are cut on, due
    ``hold`` seconds after each grid point (the sender wakes then). False outside an xl run."""
    sender = _sender
    if sender is None:
        return False
    if every > 0:
        sender.step_grid = (every, hold)
    sender.step_source = source
    return True


def flush(timeout: float = 5.0) -> bool:
    """Block (at most ``timeout`` s) until everything logged so far is stored; True if so."""
    sender = _sender
    if sender is None:
        return True
    try:
        return sender.flush(timeout)
    except Exception:
        return False


def watch(model: M, process_group: object = None) -> M:
    """Time this rank's wait at DDP's gradient all-reduce (to name stragglers); returns model.

    A no-op for models that are not DistributedDataParallel and outside an xl run.
    """
    sender = _sender
    if sender is not None and hasattr(model, "register_comm_hook"):
        sender.comm.attach(model, process_group)
    return model


def _start() -> None:
    global _sender, log
    sender = Sender()
    if sender.address[1] == 0:
        return
    _sender = sender
    log = _make_log(sender)
    sender.thread.start()


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) gets its own thread, connection and spool.
    sender = _sender
    if sender is None:
        return
    with contextlib.suppress(Exception):
        sender.reset_after_fork()


def close() -> None:
    """Send what was logged (bounded wait), spool what could not be sent; the rank's end."""
    sender = _sender
    if sender is not None:
        with contextlib.suppress(Exception):
            sender.shutdown(EXIT_WAIT_S)


_at_exit = close


log: Any = _noop_log
if os.environ.get(envnames.COLLECTOR) and os.environ.get(envnames.TOKEN):
    with contextlib.suppress(Exception):
        _start()
    if _sender is not None:
        atexit.register(_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
