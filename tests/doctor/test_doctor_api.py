"""The doctor's API for the launcher (xl.doctor.api): a failed run's causes get the registry's
own checks and fixes on facts read for a failure, and those facts are this machine's. The launch's
preflight through the same API is run end to end in tests/doctor/test_doctor_one_fix.py and
tests/e2e/test_doctor_health.py."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

from xl.doctor import api
from xl.doctor.checks import CHECKS
from xl.doctor.facts import Facts

MIB = 1024 * 1024


def _facts(**kw: object) -> Facts:
    return Facts(**{"env": {}, "python": sys.executable, **kw})  # type: ignore[arg-type]


def test_a_check_through_the_api_is_the_registrys_own() -> None:
    small = _facts(shm_total=64 * MIB, shm_free=60 * MIB, shm_path="/mnt/shm")
    roomy = _facts(shm_total=16 << 30, shm_free=16 << 30)
    for f in (small, roomy):
        shm = next(s for s in CHECKS if s.id == "shm")
        assert api.check(f, "shm") == shm.run(f)
    assert api.check(small, "shm").status is api.Status.WARN
    assert api.check(roomy, "shm").status is api.Status.OK
    with pytest.raises(KeyError):
        api.check(small, "no_such_check")


def test_growing_shared_memory_is_said_as_the_shm_check_says_it() -> None:
    host = _facts(shm_total=64 * MIB, shm_free=60 * MIB, shm_path="/mnt/shm")
    boxed = _facts(shm_total=64 * MIB, shm_free=60 * MIB, container="docker")
    assert api.grow_shm(host) == "sudo mount -o remount,size=16G /mnt/shm"
    assert api.grow_shm(boxed) == "docker run --shm-size=16g ..."
    for f in (host, boxed):
        assert api.check(f, "shm").fix == api.grow_shm(f)
    # Also when the mount is large enough: a cause may still need the way to grow it.
    assert api.grow_shm(_facts(shm_total=16 << 30, shm_free=16 << 30)).startswith("sudo mount")


@pytest.mark.parametrize("same_interpreter", [True, False], ids=["in-process", "probe"])
def test_failure_facts_are_this_machines(same_interpreter: bool) -> None:
    """This interpreter's torch is read in-process; another name of it (its environment's
    python3 beside python) by the probe: both find the torch pip installed here, and the shared
    memory mount as the kernel reports it."""
    python = sys.executable
    if not same_interpreter:
        here = Path(sys.executable)
        python = str(here.with_name("python3" if here.name != "python3" else "python"))
        assert os.path.exists(python) and python != sys.executable
    f = api.failure_facts(python, dict(os.environ))
    assert f.torch is not None and f.torch.found
    assert f.torch.version == importlib.metadata.version("torch")
    st = os.statvfs("/dev/shm")
    assert f.shm_total == st.f_frsize * st.f_blocks
    # What no cause asks is left unread: no toolkit, compiler or ldconfig probe ran.
    assert f.toolkits == [] and f.compiler is None and not f.timings_ms
