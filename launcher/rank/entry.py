"""The first code every rank runs: ``python -m xl.launcher.entry (SCRIPT | -m MODULE) ARGS...``.

torchrun starts this instead of the user's script. It
- sends the rank's stdout and stderr (file descriptors 1 and 2, so C libraries too) through a
  relay process of its own to logs/rank-<r>.log (``relay``): nothing the rank prints waits on
  the supervisor, which only reads the file;
- writes ranks/rank-<r>.json in the run dir: the PID when the rank starts, and the exit code and
  Python traceback when it ends, so a failure is explained without ``@record`` in the script;
- then runs the script (or module) as ``__main__``, exactly as ``python`` would.

It runs inside every rank before user code, so it stays small: stdlib only, no torch.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from types import ModuleType, TracebackType
from typing import Any, NoReturn

from xl import envnames
from xl.atomic import (
    makedirs_private,
    overwrite_in_place,
    write_atomic,
    write_json_atomic,
    write_unsynced,
)
from xl.launcher.rank import instrument, relay
from xl.launcher.rank.stacks import install as install_stacks
from xl.launcher.rundir.layout import RunLayout

# Frames of this module and of runpy (a frozen module on 3.11+: "<frozen runpy>").
# xl's own frames are cut from a rank's traceback: this module, the ``xl.launcher.entry`` file that
# torchrun runs (its argv path is a contract) and runpy.
_SKIP_FILES = {
    os.path.abspath(__file__),
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "entry.py"),
    os.path.abspath(runpy.__file__ or ""),
    "<frozen runpy>",
}


_output: relay.RankOutput | None = None  # the relay writing this rank's log
# A rank's record is padded with spaces (JSON ignores them) to this size: the space its exit
# record needs is held from the start, so a disk that fills meanwhile cannot hide the exit code.
_RECORD_SIZE = 4096


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def _user_tb(tb: TracebackType | None) -> TracebackType | None:
    # Drop this module's and runpy's frames: the traceback starts in the user's code.
    while tb is not None and (
        tb.tb_frame.f_code.co_filename in _SKIP_FILES
        or os.path.abspath(tb.tb_frame.f_code.co_filename) in _SKIP_FILES
    ):
        tb = tb.tb_next
    return tb


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code
    return 1


def _write_elastic_error(text: str, message: str) -> None:
    # The same file torchrun's @record writes, so torchrun's own failure summary shows the
    # traceback.
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": message,
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        }
    }
    try:
        write_json_atomic(path, data)
    except OSError:
        pass


class _Record:
    def __init__(self, run_dir: str | None, rank: int) -> None:
        self.path = str(RunLayout(run_dir).rank_record(rank)) if run_dir else None
        self.data: dict[str, Any] = {
            "rank": rank,
            "local_rank": _int_env("LOCAL_RANK"),
            # the key is a contract; record.RankReport calls it group_rank
            "node": _int_env("GROUP_RANK"),
            "pid": os.getpid(),
            "started_at": time.time(),
        }
        self.lock = threading.Lock()  # the relay's watcher thread may add a note

    def write(self, **fields: Any) -> None:
        if self.path is None:
            return
        with self.lock, relay.record_locked(self.path):
            self.data.update(fields)
            self._keep_relays_count()
            try:
                makedirs_private(os.path.dirname(self.path))
                write_atomic(self.path, _padded(json.dumps(self.data, indent=2).encode()))
            except OSError:
                self._write_in_place()

    def _keep_relays_count(self) -> None:
        """The relay adds how much output the disk refused to this file: kept when rewritten."""
        assert self.path is not None
        try:
            with open(self.path, "rb") as fh:
                lost = json.loads(fh.read()).get("log_bytes_lost")
        except (OSError, ValueError, AttributeError):
            return
        if isinstance(lost, int):
            self.data["log_bytes_lost"] = lost

    def _write_in_place(self) -> None:
        """A full disk refused the new file: overwrite the old one where it lies, in the space
        it already holds (it is padded to _RECORD_SIZE), so the rank's exit code is still
        known, not taken for a death. A long traceback is cut to its end to fit."""
        assert self.path is not None
        data = dict(self.data)
        raw = json.dumps(data).encode()
        for keep in (2000, 500, 0):
            if len(raw) <= _RECORD_SIZE:
                break
            if isinstance(data.get("traceback"), str):
                data["traceback"] = data["traceback"][-keep:] if keep else None
            raw = json.dumps(data).encode()
        overwrite_in_place(self.path, raw)

    def write_start(self) -> None:
        """The first record (the PID): atomic and private, without waiting for the disk (an
        fsync here held every rank's start ~5-10 ms on a busy machine; the outcome's is kept)."""
        if self.path is None:
            return
        try:
            makedirs_private(os.path.dirname(self.path))
            write_unsynced(self.path, _padded(json.dumps(self.data).encode()))
        except OSError:
            pass


def _padded(raw: bytes) -> bytes:
    return raw.ljust(_RECORD_SIZE) if len(raw) < _RECORD_SIZE else raw


def _supervisor_gone(run_dir: str) -> bool:
    """The run's supervisor (XL_SUPERVISOR_PID) is gone: no such process, a zombie, or another
    process that got its pid (the supervisor works in the run dir: its cwd tells it)."""
    pid = _int_env(envnames.SUPERVISOR_PID)
    if not pid:
        return False
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return not _running(pid)  # gone, or another user's process that got the pid
    return not _running(pid) or os.path.realpath(cwd) != os.path.realpath(run_dir)


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (ended, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def _settle_if_orphaned(run_dir: str | None) -> None:
    """The last rank to end while the supervisor is gone makes run.json true (from every rank's
    record and the spooled metrics): nobody else may be left to do it."""
    if not run_dir or not _supervisor_gone(run_dir):
        return
    try:
        from pathlib import Path  # noqa: PLC0415 - only when the supervisor died; ranks start light

        from xl.launcher.rundir import runrecord as record  # noqa: PLC0415 - the supervisor died
        from xl.launcher.rundir import settle  # noqa: PLC0415 - the supervisor died

        rec = record.load(Path(run_dir))
        if rec is None or rec.final or not settle.all_ranks_ended(Path(run_dir), rec):
            return
        left = record.read_rank_reports(Path(run_dir))
        last = max(left, key=lambda r: (left[r].ended_at or 0.0, r))
        if last != (_int_env("RANK") or 0):
            return  # the rank that ended last settles, once the others are gone
        client = sys.modules.get("xl.client")
        if client is not None:
            client.close()  # what xl.log could not send goes to the spool now, to be merged
        others = [report.pid for r, report in left.items() if r != last and report.pid is not None]
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_running(pid) for pid in others):
            time.sleep(0.02)
        settle.settle(Path(run_dir), stopped=False)
    except Exception:  # the rank's own outcome is already recorded; never fail it here
        pass


def _ending() -> None:
    """The script is over: its outcome is about to be recorded, then comes the traceback and the
    interpreter's teardown (atexit handlers, logging's shutdown, the last flush). The stop the
    record may start at once (this rank failed, or another did) must not cut that short, as it
    would not under torchrun: its SIGTERM is let pass; a teardown that hangs still ends at the
    stop's SIGKILL."""
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _say(text: str, run_dir: str | None, rank: int) -> None:
    """Write to the rank's stderr; if the script broke it (closed fd 2: then any file or socket
    opened since may hold that number), straight to its log."""
    if _output is None or _output.owns(2):
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
            return
        except (OSError, ValueError, AttributeError):
            pass
    if not run_dir:
        return
    try:
        fd = os.open(
            RunLayout(run_dir).rank_log(rank),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
            0o600,
        )
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def _usage() -> NoReturn:
    sys.stderr.write("usage: python -m xl.launcher.entry (SCRIPT | -m MODULE) [ARGS...]\n")
    raise SystemExit(2)


def _run_script(script: str) -> None:
    """Run ``script`` as ``python SCRIPT`` (and so torchrun) does: ``__file__`` is its absolute
    path, so a script finds the files beside it from any cwd, while ``sys.argv[0]`` stays as
    typed; runpy.run_path would give both the one path it is handed. Zip files, .pyc files and
    what cannot be read go through runpy as before."""
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError:
        source = None
    if source is None or source.startswith(b"PK\x03\x04") or path.endswith(".pyc"):
        runpy.run_path(path, run_name="__main__")
        return
    code = compile(source, path, "exec", dont_inherit=True)
    main = ModuleType("__main__")
    main.__dict__.update(
        __file__=path, __cached__=None, __loader__=None, __package__=None, __spec__=None
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling and multiprocessing find the script's classes
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def main(argv: list[str]) -> int:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        _usage()
    rank = _int_env("RANK") or 0
    run_dir = os.environ.get(envnames.RUN_DIR)
    global _output
    record = _Record(run_dir, rank)
    if run_dir:
        _output = relay.start(
            str(RunLayout(run_dir).rank_log(rank)), lambda note: record.write(relay=note)
        )
    record.write_start()
    # A crash in native code (a segfault, a bus error, an abort) prints the Python line it came
    # from to the rank's log, where the supervisor reads why it died (built in: costs nothing).
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        faulthandler.enable()
    install_stacks(run_dir, rank)  # `xl stacks` and hang captures ask the rank where it is
    instrument.install()  # HF Trainer, Lightning, Accelerate, DeepSpeed: every rank's figures

    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = [script, *argv[1:]]
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            _run_script(script)
    except SystemExit as exc:
        code = _exit_code(exc)
        error = None
        if code != 0 and exc.code is not None and not isinstance(exc.code, int):
            error = f"SystemExit: {exc.code}"
        # The record first: writing to a stream the script broke (closed fds 1 and 2) may fail.
        _ending()
        record.write(exit_code=code, traceback=None, error=error, ended_at=time.time())
        if error is not None:
            _say(f"{exc.code}\n", run_dir, rank)  # what Python prints for sys.exit("message")
        return code
    except BaseException as exc:
        tb = _user_tb(exc.__traceback__)
        text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n")
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        _ending()
        record.write(exit_code=code, traceback=text, error=last, ended_at=time.time())
        _write_elastic_error(text, last)
        _say(text + "\n", run_dir, rank)
        return code
    _ending()
    record.write(exit_code=0, traceback=None, ended_at=time.time())
    return code


def run() -> None:
    """Run as a rank's main program (``python -m xl.launcher.entry``): exits with the script's
    code."""
    status = main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if _output is not None:
        # The relay writes on until this process is gone: atexit handlers, logging's shutdown
        # and the interpreter's last flush reach the log too.
        _output.finish()
    _settle_if_orphaned(os.environ.get(envnames.RUN_DIR))
    raise SystemExit(status)


if __name__ == "__main__":
    run()
