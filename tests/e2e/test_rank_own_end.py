"""A rank that ends of its own is said by its own end, and a printed CUDA error by its error line:
the real `xl launch --no-tui --nproc 2` with gloo CPU ranks. Both ranks giving up with their own
exit code, or both raising their own error, are each "exited with code N" and "failed", never
"stopped", though xl's stop signalled the later one in its teardown; a healthy rank the stop
killed is "stopped (-15)". A rank that prints torch's CUDA error with its advice lines after it
and exits is headlined by the error line. The live lines, the end table, run.json, its events and
`xl runs --json` say the same; no process of a run is left.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from procs import XL, run_json, wait_no_processes, wait_run, xl, xl_env
from supervised import GRACE, write_script

pytestmark = pytest.mark.e2e

GIVE_UP = """
import sys, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print(f"rank {dist.get_rank()} gives up: nothing to train on", file=sys.stderr, flush=True)
sys.exit(3)
"""

BAD_CONFIG = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
raise ValueError(f"rank {dist.get_rank()} read a bad config")
"""

NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
# What torch prints under every CUDA error.
ADVICE = "\n".join(
    [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]
)
# Rank 1 prints what torch prints for a kernel built for another GPU, and exits; rank 0 waits at
# a barrier until xl's stop ends it.
PRINTS_CUDA_ERROR = f"""
import sys, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    sys.stderr.write('''Traceback (most recent call last):
  File "/srv/job/layers.py", line 41, in forward
    y = fused_act(x)
{NO_KERNEL}
{ADVICE}
''')
    sys.stderr.flush()
    sys.exit(1)
dist.barrier()
"""

_END = re.compile(r"^\d\d:\d\d:\d\d xl: (rank (\d+) (?:exited with code|stopped|was killed).*)$")
_ROW = re.compile(r"^\|\s+(\d+) \| (\w+ \(-?\d+\))\s")


def _launch(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    home = tmp_path / "home"
    script = write_script(tmp_path, "train.py", body)
    proc = subprocess.run(
        [*XL, "launch", "--no-tui", "--nproc", "2", str(script)],
        env=xl_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    run_dir = wait_run(home)
    wait_no_processes(run_dir, timeout=GRACE + 10)
    return proc, run_dir


def _told(
    proc: subprocess.CompletedProcess[str], run_dir: Path
) -> tuple[dict[int, str], dict[int, str], dict[str, Any]]:
    """Each rank's end as the live lines say it and as the end table does, once each; and the
    run's failure, checked to be the same in run.json, its one event, `xl runs --json` and the
    live line."""
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    lines = out.splitlines()
    said = [m for m in map(_END.match, lines) if m]
    ends = {int(m.group(2)): m.group(1) for m in said}
    assert len(said) == len(ends) == 2, out
    table = {int(m.group(1)): m.group(2) for m in map(_ROW.match, lines) if m}
    run = run_json(run_dir)
    assert run["status"] == "failed"
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    exited = {e["rank"]: e["message"] for e in events if e["kind"] == "rank_exited"}
    assert exited == ends, (exited, ends)
    failure = run["failure"]
    failures = [e for e in events if e["kind"] == "failure"]
    assert len(failures) == 1 and failures[0]["message"] == failure["message"], failures
    listed = json.loads(xl(["runs", "--json"], xl_env(run_dir.parent.parent)).stdout)
    assert [r["failure"]["message"] for r in listed] == [failure["message"]], listed
    assert any(ln.endswith(f" xl: {failure['message']}") for ln in lines), out
    return ends, table, run


@pytest.mark.parametrize(
    ("body", "code", "own"),
    [
        (GIVE_UP, 3, "rank {r} gives up: nothing to train on"),
        (BAD_CONFIG, 1, "ValueError: rank {r} read a bad config"),
    ],
    ids=["sys_exit_3", "own_error"],
)
def test_ranks_that_end_of_their_own_are_said_by_their_own_end(
    tmp_path: Path, body: str, code: int, own: str
) -> None:
    proc, run_dir = _launch(tmp_path, body)
    ends, table, run = _told(proc, run_dir)
    assert ends == {r: f"rank {r} exited with code {code}" for r in (0, 1)}, proc.stdout
    assert "stopped" not in proc.stdout, proc.stdout
    assert table == {0: f"failed ({code})", 1: f"failed ({code})"}, proc.stdout
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "failed", code),
        (1, "failed", code),
    ]
    first = run["failure"]["rank"]
    assert first in (0, 1) and run["failure"]["exit_code"] == code
    assert own.format(r=first) in run["failure"]["message"], run["failure"]
    # Each rank's own words stay its own: its log ends with them.
    for r in (0, 1):
        assert own.format(r=r) in (run_dir / "logs" / f"rank-{r}.log").read_text()


def test_a_printed_cuda_error_is_headlined_by_its_error_line(tmp_path: Path) -> None:
    proc, run_dir = _launch(tmp_path, PRINTS_CUDA_ERROR)
    ends, table, run = _told(proc, run_dir)
    # The healthy rank xl's stop ended is "stopped"; the rank that failed, by its exit.
    assert ends == {0: "rank 0 stopped (-15)", 1: "rank 1 exited with code 1"}, proc.stdout
    assert table == {0: "stopped (-15)", 1: "failed (1)"}, proc.stdout
    assert [(r["rank"], r["state"], r["exit_code"]) for r in run["ranks"]] == [
        (0, "stopped", -15),
        (1, "failed", 1),
    ]
    failure = run["failure"]
    assert failure["rank"] == 1 and failure["cause"]["kind"] == "no_kernel_image", failure
    assert failure["message"] == f"rank 1 failed first: rank 1 exited with code 1: {NO_KERNEL}"
    assert "TORCH_USE_CUDA_DSA" not in failure["message"]
    # The run's last word, as it ends the plain view.
    assert f"{failure['message']}\n" in proc.stdout, proc.stdout
