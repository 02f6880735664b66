"""Nobody else's bytes on your terminal (docs/security.md, round 2: row 3): a rank's output may be
OSC 52 (a clipboard write), OSC 0 (the window title) or any other escape. Wherever xl shows text
from a rank to a person's terminal, control characters are drawn (xl.textsafe.visible), never sent;
the run dir keeps the raw bytes.

A real run (torchrun, CPU ranks) prints escapes, names a thread with one and fails with one in its
exception; the Rich view runs in a pseudo-terminal, `xl stacks` asks the live ranks, `xl logs`
runs in a pseudo-terminal and in a pipe, `xl attach --no-tui` prints the failure, the app (`xl
attach` on a terminal) shows the ranks' output and leaves its closing lines, `xl launch` with the
app runs a second run to its end, and `xl compare` sets the two side by side.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import textwrap
import threading
import time
from pathlib import Path

from procs import (
    XL,
    end_run,
    wait_for,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)

from xl.launcher.rundir.outcome import Failure
from xl.launcher.stacks.model import StacksDoc
from xl.textsafe import visible
from xl.tui.screens.monitor import failure_text
from xl.tui.screens.stacks import stacks_text

CLIP = "\x1b]52;c;SGVsbG8=\x07"  # OSC 52: writes "Hello" to the clipboard
TITLE = "\x1b]0;pwned\x07"  # OSC 0: the window title
ATTACKS = (b"\x1b]52;", b"\x1b]0;pwned")

SCRIPT = textwrap.dedent(
    f"""
    import os, sys, threading, time
    rank = int(os.environ["RANK"])
    name = {TITLE!r} + "-thread"
    threading.Thread(target=time.sleep, args=(300,), name=name, daemon=True).start()
    print("rank", rank, "says" + {CLIP!r}, flush=True)
    print("title" + {TITLE!r}, flush=True)
    print("redraw\\r" + {TITLE!r} + "done", flush=True)
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    if rank == 1 and len(sys.argv) == 2:
        raise ValueError("bad input " + {CLIP!r})
    """
)


def _in_pty(
    argv: list[str], env: dict[str, str], cwd: Path, *, keys: bytes = b"", once: bytes = b""
) -> tuple[subprocess.Popen[bytes], list[bytes]]:
    """Start ``argv`` on a pseudo-terminal; its output is gathered by a thread until it ends.
    ``keys`` are typed once the output shows ``once`` (the app drew what the test looks for)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    os.set_blocking(master, False)
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    out: list[bytes] = []

    def pump() -> None:
        nonlocal keys
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                out.append(data)
                if keys and once in b"".join(out):
                    os.write(master, keys)
                    keys = b""
            elif proc.poll() is not None:
                break
        os.close(master)

    threading.Thread(target=pump, daemon=True).start()
    return proc, out


def test_escapes_from_ranks_are_drawn_on_every_terminal_view(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    home = tmp_path / "home"
    env = xl_env(home, TERM="xterm-256color", COLUMNS="160", LINES="40")
    view, view_out = _in_pty(
        [*XL, "launch", "--no-tui", "--nproc", "2", str(script), str(tmp_path / "go")],
        env,
        tmp_path,
    )
    run_dir = None
    try:
        run_dir = wait_run(home)
        wait_ranks_running(run_dir, 2, timeout=90)
        wait_for(
            lambda: all(
                CLIP.encode() in (run_dir / "logs" / f"rank-{r}.log").read_bytes() for r in (0, 1)
            ),
            timeout=60,
            what="both ranks' output",
        )
        stacks = xl(["stacks", "last"], env, timeout=60)
        assert stacks.returncode == 0, stacks.stderr
        assert "␛]0;pwned␇-thread" in stacks.stdout  # the thread's name, drawn
        logs_tty, logs_out = _in_pty([*XL, "logs", "last"], env, tmp_path)
        assert logs_tty.wait(timeout=60) == 0
        (tmp_path / "go").touch()
        assert view.wait(timeout=90) == 1  # rank 1 failed
        time.sleep(0.5)  # the pty's last bytes
        shown = b"".join(view_out)
        assert b"rank 1" in shown and b"ValueError" in shown, shown[-2000:]
        assert "␛]52;c;SGVsbG8=␇".encode() in shown  # the failure's text, drawn in the view
        attach = subprocess.run(
            [*XL, "attach", "last", "--no-tui"], env=env, capture_output=True, timeout=60
        )
        attach_tty, attach_out = _in_pty([*XL, "attach", "last", "--no-tui"], env, tmp_path)
        assert attach_tty.wait(timeout=60) == 1
        logs_pipe = subprocess.run(
            [*XL, "logs", "last", "--rank", "1"], env=env, capture_output=True, timeout=60
        )
        # The app on a terminal: the selected rank's output drawn in its log, and once left (q),
        # the ended run's closing lines (the traceback and the outcome) on the terminal.
        drawn_clip = "␛]52;c;SGVsbG8=".encode()
        app, app_out = _in_pty([*XL, "attach", "last"], env, tmp_path, keys=b"q", once=b"redraw")
        assert app.wait(timeout=90) == 1
        # A second run, to its end under the app (`xl launch` on a terminal), then both compared:
        # its argument and environment carry escapes too.
        second, second_out = _in_pty(
            [
                *XL,
                "launch",
                "--nproc",
                "2",
                "--env",
                "XL_TEST_VAR=v" + CLIP,
                str(script),
                "go",
                "arg" + TITLE,
            ],
            env,
            tmp_path,
        )
        assert second.wait(timeout=120) == 0
        compare, compare_out = _in_pty([*XL, "compare", run_dir.name, "last"], env, tmp_path)
        assert compare.wait(timeout=60) == 0
        time.sleep(0.3)
        logs_shown = b"".join(logs_out)
        app_shown = b"".join(app_out)
        assert drawn_clip in app_shown and "redraw␍␛]0;pwned␇done".encode() in app_shown, app_shown[
            -3000:
        ]
        closing = app_shown.rsplit(b"\x1b[?1049l", 1)[-1]  # after the app left the alternate screen
        assert "ValueError: bad input ␛]52;c;SGVsbG8=␇".encode() in closing, closing
        assert b"xl logs " + run_dir.name.encode() + b" --rank 1" in closing, closing
        compared = b"".join(compare_out)
        assert "arg␛]0;pwned␇".encode() in compared and "v␛]52;c;SGVsbG8=␇".encode() in compared, (
            compared
        )
        for what, data in (
            ("view", shown),
            ("stacks", stacks.stdout.encode()),
            ("logs on a terminal", logs_shown),
            ("attach --no-tui on a terminal", b"".join(attach_out)),
            ("the app", app_shown),
            ("the app's own run", b"".join(second_out)),
            ("compare", compared),
        ):
            for attack in ATTACKS:
                assert attack not in data, (what, attack)
        # To a pipe, the ranks' lines are copied as they are (as `xl logs` does); xl's own lines
        # (the failure, the table's last-line column) draw what came from a rank.
        assert "ValueError: bad input ␛]52;c;SGVsbG8=␇".encode() in attach.stdout
        assert all(
            line.startswith(b"[rank ") for line in attach.stdout.split(b"\n") if b"\x1b]" in line
        ), attach.stdout
        assert "says␛]52;c;SGVsbG8=␇".encode() in logs_shown
        # The files keep the bytes, and `xl logs` to a pipe copies them as they are.
        raw = (run_dir / "logs" / "rank-1.log").read_bytes()
        assert CLIP.encode() in raw and TITLE.encode() in raw
        assert logs_pipe.returncode == 0 and logs_pipe.stdout == raw
    finally:
        (tmp_path / "go").touch()
        if view.poll() is None:
            view.kill()
        end_run(None, run_dir, timeout=30)


def test_the_apps_banners_and_stacks_draw_control_characters() -> None:
    failure = Failure.from_json(
        {"rank": 1, "exit_code": 1, "traceback": f"Traceback\n  File x\nValueError: {CLIP}"}
    )
    banner = failure_text(failure, keep=5)
    assert banner is not None and "\x1b" not in banner.plain and "\x07" not in banner.plain
    assert "ValueError: ␛]52;c;SGVsbG8=␇" in banner.plain and banner.plain.count("\n") == 3
    doc = {
        "ranks": [
            {
                "rank": 0,
                "pid": 1,
                "threads": [
                    {"name": TITLE, "frames": [{"file": "a\x1b[2J.py", "line": 1, "function": "f"}]}
                ],
            }
        ]
    }
    text = stacks_text(StacksDoc.from_json(doc), 0).plain
    assert "\x1b" not in text and "thread ␛]0;pwned␇" in text and "a␛[2J.py:1 in f" in text


def test_visible_draws_every_control_and_keeps_the_rest() -> None:
    assert visible("a\x1b[31mb\r\x9b2J\u202ec\td") == "a␛[31mb␍<9b>2J<U+202E>c\td"
    assert visible("line 1\nline 2") == "line 1␊line 2"
    assert visible("line 1\nline 2", lines=True) == "line 1\nline 2"
    assert visible("ünïcode ✓ 日本") == "ünïcode ✓ 日本"
