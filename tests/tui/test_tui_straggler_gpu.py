"""The Monitor's straggler banner says what holds the straggler's GPU back, as its event said,
and that it has become chronic once the second event says so. Fed a recorded run
(runfixtures.add_step_split) with the straggler events the diagnoser writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import runfixtures
from pilotwait import until
from where import FIXTURES

from xl.tui.app import build_app
from xl.tui.widgets.text_lines import TextLines

NOW = runfixtures.T0 + 130
RULE = "rank 1 is the straggler: 300 ms of its 310 ms step computing"
DETAIL = "GPU 1: thermal slowdown at 87 °C, SM 1,290 of 1,980 MHz"


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "xlhome" / "runs"
    shutil.copytree(FIXTURES / "runs", root)
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    return runfixtures.add_step_split(root / "20260530-straggler")


def _said(run_dir: Path, t: float, message: str, lasting: str) -> None:
    event = {
        "t": t, "kind": "straggler", "rank": 1, "phase": "compute", "method": "step_phase",
        "message": message, "gpu": 1, "gpu_reason": "hw_thermal_slowdown", "gpu_detail": DETAIL,
        "lasting": lasting, "since_s": 61.0 if lasting == "chronic" else 5.0, "spells": 1,
    }  # fmt: skip
    with (run_dir / "events.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(event) + "\n")


async def test_the_banner_names_the_straggler_s_gpu_and_then_that_it_is_chronic(
    run_dir: Path,
) -> None:
    _said(run_dir, runfixtures.T0 + 126, f"{RULE}; {DETAIL}", "transient")
    app = build_app(monitor_run_dir=run_dir, clock=lambda: NOW, poll_interval=0.2)
    async with app.run_test(size=(200, 60)) as pilot:
        banner = app.screen.query_one("#straggler-banner", TextLines)
        await until(pilot, lambda: DETAIL in banner.text.plain, "the GPU's reason in the banner")
        assert banner.text.plain == f"straggler  compute : {RULE}; {DETAIL}"
        _said(run_dir, runfixtures.T0 + 129, f"{RULE}; {DETAIL} (chronic: for 61 s)", "chronic")
        await until(pilot, lambda: "chronic" in banner.text.plain, "the chronic event's words")
        assert banner.text.plain.endswith(f"{DETAIL} (chronic: for 61 s)")
