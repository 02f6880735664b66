"""Run a command with a hard timeout and capped output, and run probes side by side on threads
(each a `Job` whose `Outcome` is typed by what its callable returns)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from xl.doctor.facts import CmdResult

T = TypeVar("T")

CMD_TIMEOUT = 2.5  # seconds; the issue allows at most 3
OUTPUT_CAP = 256 * 1024


def run_cmd(
    argv: list[str],
    timeout: float = CMD_TIMEOUT,
    env: Mapping[str, str] | None = None,
    label: str | None = None,
) -> CmdResult:
    """Run argv; never raises. The whole process group dies on timeout or runaway output.
    `label` names the command in messages (default: the program's name and its arguments)."""
    result = CmdResult(argv=list(argv))
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        result.problem = f"{argv[0]} not found"
        return result
    except PermissionError:
        result.problem = f"{argv[0]} is not executable (permission denied)"
        return result
    except OSError as exc:
        result.problem = f"{argv[0]} can't run: {exc.strerror or exc}"
        return result

    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + timeout
    overflow = timed_out = False
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map() and not overflow:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fd] += chunk
                overflow = overflow or len(bufs[key.fd]) > OUTPUT_CAP
    if timed_out or overflow:
        _kill_group(proc)
    try:
        # Both pipes closed: the process is exiting; a short wait covers the gap.
        proc.wait(timeout=1 if (timed_out or overflow) else max(0.2, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        timed_out = True
    for stream in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    result.stdout = bytes(bufs[out_fd][:OUTPUT_CAP]).decode("utf-8", "replace")
    result.stderr = bytes(bufs[err_fd][:OUTPUT_CAP]).decode("utf-8", "replace")
    result.returncode = proc.returncode
    name = label or " ".join([os.path.basename(argv[0]), *argv[1:]])
    if timed_out:
        result.problem = f"`{name}` did not answer within {timeout:g} s"
    elif overflow:
        result.problem = f"`{name}` printed more than {OUTPUT_CAP // 1024} KiB"
    elif proc.returncode != 0:
        line = result.first_line() or "no output"
        result.problem = f"`{name}` exited with {proc.returncode}: {line}"
    return result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What a job came to: its value, or why there is none (it raised, or ran past its time)."""

    value: T | None
    error: str | None
    ms: float  # how long it ran (the time waited for it when it did not finish)


class Job(Generic[T]):
    """One callable on its own thread, started now; `result` waits for it (bounded) later."""

    def __init__(self, name: str, fn: Callable[[], T]) -> None:
        self.name = name
        self._fn = fn
        self._outcome: Outcome[T] | None = None
        self._thread = threading.Thread(target=self._target, name=f"xl-doctor-{name}", daemon=True)
        self._thread.start()

    def _target(self) -> None:
        t0 = time.perf_counter()
        value: T | None = None
        error = None
        try:
            value = self._fn()
        except BaseException as exc:  # a probe bug must not cost the report
            error = f"{type(exc).__name__}: {exc}"
        self._outcome = Outcome(value, error, (time.perf_counter() - t0) * 1000)

    def result(self, timeout: float = CMD_TIMEOUT + 1.5) -> Outcome[T]:
        self._thread.join(timeout)
        done = self._outcome
        if self._thread.is_alive() or done is None:
            return Outcome(None, f"did not finish within {timeout:g} s", timeout * 1000)
        return done
