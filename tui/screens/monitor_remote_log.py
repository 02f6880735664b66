"""The Monitor's log pane for a rank of another node, on node 0 of a multi-node run.

Such a rank's output stays in its own node's run dir (docs/multinode.md, "Node 0 is the run's one
view"); node 0 holds at most the last lines its node sent as the rank exited. So while the run
lives, the pane of the rank the person follows asks its node for it through node 0's supervisor
(``Backend.rank_output``, the way ``xl logs RUN --rank R`` asks): the last KEEP_BYTES first, then
what the rank adds, by offset, at most every FETCH_EVERY_S, one piece (64 KiB at most) a time.
Only the followed rank is asked, on the Monitor's poller thread, never the event loop. When the
node cannot answer (unreachable, or the run is over) the pane shows the lines node 0 kept, or
says in one line where the output is, as ``xl logs`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xl.tui.widgets.rank_log import LogLines

if TYPE_CHECKING:
    from xl.launcher.view.reader import RunReader
    from xl.launcher.view.runview import RunView
    from xl.tui.backend import Backend

FETCH_EVERY_S = 2.0  # a rank of another node is asked at most this often
RETRY_S = 10.0  # after its node did not answer (each try may wait for its timeout)
KEEP_BYTES = 64 << 10  # what the pane starts with, and the most it falls behind by

# (reader, rank, reset, ranks read before) -> the lines of a rank's log in node 0's run dir
ReadLocal = Callable[["RunReader", int, bool, set[int]], list[str]]


def remote_node(view: RunView, rank: int) -> tuple[int, str] | None:
    """(its node, that node's host) when ``view`` is node 0's view of a multi-node run and
    ``rank`` runs on another node; None otherwise (its output is here)."""
    rec = view.record
    if rec.nnodes < 2 or rec.node_rank != 0:
        return None
    row = next((r for r in rec.ranks if r.rank == rank), None)
    if row is None or not row.node_rank:
        return None
    return row.node_rank, row.host or "?"


def where_line(run: str, rank: int, node: int, host: str) -> str:
    """Where a rank's output is when node 0 cannot ask its node (the words ``xl logs`` says)."""
    return (
        f"rank {rank} ran on node {node} ({host}), which keeps its output, and node 0 cannot "
        f"ask it now; on node {node}, run: xl logs RUN --rank {rank} (its 'xl runs' names RUN)"
    )


def skipped_note(run: str, rank: int, node: int, host: str) -> str:
    """The pane's first line when it starts at the last KEEP_BYTES: the command (here, on node
    0, while the run lives) that prints the whole output."""
    return (
        f"… earlier output skipped: it is on node {node} ({host}); "
        f"xl logs {run} --rank {rank} prints it all"
    )


def kept_note(rank: int, node: int, host: str) -> str:
    """The pane's first line when it shows the last lines node 0 kept of a rank that exited."""
    return (
        f"… node 0 kept rank {rank}'s last lines only: the whole output is on node {node} "
        f"({host}); there, run: xl logs RUN --rank {rank} (its 'xl runs' names RUN)"
    )


@dataclass
class _Asking:
    """The rank whose node is being asked, and how far its output was read."""

    rank: int
    node: int
    host: str
    offset: int | None = None  # None: not asked yet
    partial: bytes = b""  # the start of a line whose newline has not come yet
    next_at: float = 0.0
    told: bool = False  # the where line was shown since the last piece
    local: bool = False  # node 0 holds its lines (the run is over): read them as a local rank's


class RemoteLog:
    """What the log pane shows of the followed rank: its log here, or what its node sends."""

    def __init__(
        self,
        run_dir: Path,
        tail: int,
        read_local: ReadLocal,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.tail = tail  # the most lines the pane starts with, as for a local rank
        self.read_local = read_local
        self.tailed: set[int] = set()  # the ranks read_local has read (theirs to say)
        self.run = run_dir.name  # the run's id, as node 0's commands name it
        self.clock = clock
        self._asking: _Asking | None = None

    def lines(
        self,
        backend: Backend,
        reader: RunReader,
        view: RunView,
        rank: int,
        reset: bool,
    ) -> list[str]:
        """The lines to add to the pane (a LogLines replaces it: a rank chosen, or the lines node
        0 kept once its node can no longer be asked). A rank whose output node 0 holds is read
        from its log (``read_local``)."""

        def local(reset: bool) -> list[str]:
            return self.read_local(reader, rank, reset, self.tailed)

        asking = self._asking
        if reset or asking is None or asking.rank != rank:
            where = remote_node(view, rank)
            if where is None:
                self._asking = None
                return local(reset)
            asking = self._asking = _Asking(rank, *where)
            reset = True
        if asking.local:
            return local(reset)
        now = self.clock()
        if not reset and now < asking.next_at:
            return []
        piece = None if view.final else self._fetch(backend, asking)
        if piece is not None:
            asking.next_at, asking.told = now + FETCH_EVERY_S, False
            if not reset:
                return piece
            # Its first line says what was left out, when anything was.
            note = skipped_note(self.run, rank, asking.node, asking.host)
            cut = bool(piece) and piece[0] == note
            body = piece[1:] if cut else piece
            if cut or len(body) > self.tail:
                return LogLines([note, *body[-self.tail :]])
            return LogLines(body)
        asking.next_at = now + RETRY_S
        if reader.log_path(rank).is_file():
            # The run is over (or the node is gone) and node 0 kept the rank's last lines.
            asking.local = True
            kept = local(True)
            return LogLines(
                [kept_note(rank, asking.node, asking.host), *kept],
                skipped=getattr(kept, "skipped", 0),
                path=getattr(kept, "path", None),
            )
        if view.final and asking.told:
            return []
        line = where_line(self.run, rank, asking.node, asking.host)
        if reset:
            asking.told = True
            return LogLines([line])
        if asking.told:
            return []
        asking.told = True
        return [line]

    def _fetch(self, backend: Backend, asking: _Asking) -> list[str] | None:
        """The next piece's whole lines (None: the node did not answer)."""
        start = asking.offset or 0
        answer = self._piece(backend, asking, start)
        if answer is None:
            return None
        data, size = answer
        notes: list[str] = []
        if size - (start + len(data)) > KEEP_BYTES:
            # More than KEEP_BYTES behind (the first ask, or a rank writing faster than the pane
            # reads): start again at the output's last KEEP_BYTES, from its next line.
            start = size - KEEP_BYTES
            answer = self._piece(backend, asking, start)
            if answer is None:
                return None
            data, size = answer
            asking.offset, asking.partial = start + len(data), b""
            data = data[data.find(b"\n") + 1 :]
            notes.append(skipped_note(self.run, asking.rank, asking.node, asking.host))
        else:
            asking.offset = start + len(data)
        *whole, asking.partial = (asking.partial + data).split(b"\n")
        if len(asking.partial) > KEEP_BYTES:  # a line without end: shown as it is so far
            whole.append(asking.partial)
            asking.partial = b""
        return notes + [line.decode("utf-8", "replace") for line in whole]

    def _piece(self, backend: Backend, asking: _Asking, offset: int) -> tuple[bytes, int] | None:
        """A piece of the rank's output from ``offset``, as bytes, and the output's size."""
        piece = backend.rank_output(self.run_dir, asking.rank, asking.node, offset)
        return None if piece is None else (piece.data, piece.size)
