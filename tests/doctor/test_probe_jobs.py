"""xl.doctor.probes.commands.Job: a probe on its own thread whose Outcome is typed by what it
returns; a probe that raises or hangs costs its answer, never the report."""

from __future__ import annotations

import threading

from xl.doctor.probes.commands import Job


def test_a_job_returns_its_value_and_its_time() -> None:
    got = Job("answer", lambda: 42).result()
    assert got.value == 42 and got.error is None and got.ms >= 0


def test_a_job_that_raises_says_why() -> None:
    def broken() -> int:
        raise RuntimeError("probe bug")

    got = Job("broken", broken).result()
    assert got.value is None and got.error == "RuntimeError: probe bug"


def test_a_job_that_hangs_is_given_up_on() -> None:
    release = threading.Event()
    job = Job("hangs", lambda: release.wait(5))
    got = job.result(timeout=0.05)
    assert got.value is None and got.error == "did not finish within 0.05 s" and got.ms == 50
    release.set()
    assert job.result().value is True  # asked again once it is done: its own answer
