"""A run whose supervisor is slow to start (a busy machine, a slow NFS home), for as long as a
test looks: started through the library, as the app starts one (`xl launch` forks its
supervisor, which has its interpreter already), its interpreter waits in sitecustomize, before
it imports anything of xl, until the test's gate file exists (at most two minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SLOW_SITE = """
import os, time
with open("/proc/self/cmdline", "rb") as fh:
    if b"xl.launcher.supervisor" in fh.read():
        gate, end = os.environ.get("XL_TEST_START_GATE", ""), time.monotonic() + 120
        while gate and not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.05)
"""
START = (
    "import sys; from xl.launcher.control import start_run; from xl.launcher.spec import "
    "LaunchSpec\n"
    "print(start_run(LaunchSpec(script=sys.argv[1], args=sys.argv[2:], nproc=2)).run_id)\n"
)


def start_slow(
    tmp_path: Path, env: dict[str, str], script: Path, *args: str
) -> tuple[Path, dict[str, str]]:
    """Two ranks of ``script ARGS``, their supervisor held until ``tmp_path / "gate"`` exists:
    the run dir and the environment that holds it (for the test's own `xl` commands)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLOW_SITE)
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
        "XL_TEST_START_GATE": str(tmp_path / "gate"),
    }
    done = subprocess.run(
        [sys.executable, "-c", START, str(script), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return Path(env["XL_HOME"]) / "runs" / done.stdout.strip(), env
