"""The Monitor on a run, headless, timing each refresh: bench_scale.py's viewer.

    python bench/scale_monitor.py RUN_DIR OUT_JSON

The app is built as ``xl attach`` builds it (``build_app(monitor_run_dir=..., attach_only=True)``,
tui/app.py's run_monitor) and runs under Textual's headless driver (``app.run_test``) at 200x50,
so it reads the run dir and lays out and paints every screen update as on a terminal, with no
terminal to write to. It touches OUT_JSON's ``.shown`` twin once it first showed the run. A
refresh is timed from the start of the reader's poll (the Monitor's poll thread) to the end of the
repaint that shows it (as bench_tui.py times its apply). It runs until SIGTERM, then writes
``{"refresh_s": [...], "refresh_at": [when each ended], "poll_s": [...], "started": t,
"first_shown": t}`` to OUT_JSON, with ``rows``: the rows of its rank table at the last refresh
(past 64 ranks, the chosen node's ranks) and ``node_rows``: its node table's (None: none shown).
Its CPU is measured from outside, by the bench, over the bench's window.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: scale_monitor.py RUN_DIR OUT_JSON", file=sys.stderr)
        return 2
    run_dir, out = Path(argv[0]), Path(argv[1])
    from xl.tui.app import build_app  # noqa: PLC0415 - after the arguments: a usage error costs no Textual
    from xl.tui.screens.monitor import MonitorScreen  # noqa: PLC0415 - as above
    from xl.tui.widgets.rank_table import RankTable  # noqa: PLC0415 - as above

    record: dict[str, Any] = {
        "refresh_s": [],
        "refresh_at": [],
        "poll_s": [],
        "started": time.time(),
        "first_shown": None,
        "views": 0,
        "rows": 0,
        "node_rows": None,
    }
    began: list[float] = []
    poll_once = MonitorScreen._poll_once

    def timed_poll(self: Any) -> Any:
        t = time.perf_counter()
        began.append(t)
        try:
            return poll_once(self)
        finally:
            record["poll_s"].append(time.perf_counter() - t)

    MonitorScreen._poll_once = timed_poll  # type: ignore[method-assign]
    polled = MonitorScreen.on_monitor_screen_polled

    def timed_polled(self: Any, message: Any) -> None:
        t = began[-1] if began else time.perf_counter()
        polled(self, message)
        if message.view is not None:
            record["views"] += 1

        def done() -> None:
            record["refresh_s"].append(time.perf_counter() - t)
            record["refresh_at"].append(time.time())
            if record["first_shown"] is None and message.view is not None:
                record["first_shown"] = time.time()
                out.with_suffix(".shown").touch()  # the bench opens its window after this
            record["rows"] = self.query_one(RankTable).row_count  # the ranks the table holds
            # Past 64 ranks the Monitor leads with a row per node (the rank table then holds the
            # chosen node's ranks); an older Monitor has no node table.
            nodes = self.query("#node-table")
            record["node_rows"] = len(getattr(nodes.first(), "rows", ())) if nodes else None

        self.call_after_refresh(done)

    MonitorScreen.on_monitor_screen_polled = timed_polled  # type: ignore[method-assign]
    stop = asyncio.Event()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        app = build_app(monitor_run_dir=run_dir, attach_only=True)
        async with app.run_test(size=(200, 50)):
            await stop.wait()

    asyncio.run(run())
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
