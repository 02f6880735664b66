"""The plain view of the nodes' environments compared (launcher/cli/console.py): node 0 writes
one ``env_diff`` event per field in which a node differs; a person reads one line per odd node,
with each field, its value beside the others' and the fixes, and nothing of the nodes alike."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from xl.launcher.cli import console
from xl.launcher.cli.consolerun import ConsoleRun
from xl.launcher.rundir.events import EventLine, parse_event


def _read(obj: dict[str, Any]) -> EventLine:
    line = parse_event(obj)
    assert line is not None
    return line


def _diff(node: int, field: str, value: Any, others: Any, **kw: Any) -> EventLine:
    return _read(
        {
            "kind": "env_diff",
            "t": 1_800_000_000.0,
            "node": node,
            "host": f"h{node}",
            "field": field,
            "value": value,
            "others": others,
            "severity": kw.get("severity", "stop"),
            "fix": kw.get("fix"),
            "message": f"node {node} ({field} alone)",
        }
    )


NOTICE = _read({"kind": "run_started", "t": 1_800_000_001.0, "message": "starting 1 rank on CPU"})
TORCH = _diff(2, "torch", "2.6.0", "2.7.1", fix="pip install torch==2.7.1")
CUDA = _diff(2, "torch_cuda", "12.4", "11.8")
SHM = _diff(1, "shm_bytes", 1 << 30, 8 << 30, severity="warn")
IB = _diff(3, "env.NCCL_IB_DISABLE", None, "1", severity="warn", fix="export NCCL_IB_DISABLE=1")


def _plain(tmp_path: Path) -> tuple[console._Plain, io.StringIO]:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "status": "running"}))
    out = io.StringIO()
    return console._Plain(ConsoleRun(tmp_path), out, lines=False), out


def _said(out: io.StringIO) -> list[str]:
    return [line.split(" xl: ", 1)[1] for line in out.getvalue().splitlines()]


def test_each_odd_node_is_one_line_with_every_field_and_its_fixes(tmp_path: Path) -> None:
    plain, out = _plain(tmp_path)
    plain.events([TORCH, SHM, CUDA, IB, NOTICE])
    assert _said(out) == [
        "node 1 (h1) differs [warning]: /dev/shm size 1.0 GiB (others 8.0 GiB)",
        "node 2 (h2) differs [stops the run]: torch 2.6.0 (others 2.7.1), torch's CUDA 12.4 "
        "(others 11.8); fix there: pip install torch==2.7.1",
        "node 3 (h3) differs [warning]: NCCL_IB_DISABLE unset (others 1); "
        "fix there: export NCCL_IB_DISABLE=1",
        "starting 1 rank on CPU",
    ]


def test_a_node_s_fields_read_in_two_polls_still_make_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "_SETTLE_S", 3600.0)  # however slow this machine is
    plain, out = _plain(tmp_path)
    plain.events([TORCH])
    assert out.getvalue() == ""  # its other field may come in the next poll
    plain.events([CUDA])
    assert out.getvalue() == ""
    plain.events([NOTICE])
    [line, notice] = _said(out)
    assert line.startswith("node 2 (h2) differs [stops the run]: torch 2.6.0 (others 2.7.1), ")
    assert notice == "starting 1 rank on CPU"


def test_the_last_fields_are_said_at_the_end_of_the_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console, "_SETTLE_S", 3600.0)
    plain, out = _plain(tmp_path)
    plain.events([TORCH, CUDA])
    assert out.getvalue() == ""
    plain.events([], force=True)
    [line] = _said(out)
    assert "torch 2.6.0 (others 2.7.1), torch's CUDA 12.4 (others 11.8)" in line


def test_nodes_alike_say_nothing(tmp_path: Path) -> None:
    plain, out = _plain(tmp_path)
    plain.events([NOTICE])
    assert _said(out) == ["starting 1 rank on CPU"]
    assert console.fold_env_diffs([NOTICE]) == [NOTICE]
