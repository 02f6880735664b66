"""The rank entry's framework hooks, in fresh interpreters: nothing is imported ahead of the
script, a watched import gets patched, XL_INSTRUMENT=0 and a run without xl leave it alone; the
log parser keeps evaluation and sanity-check bars apart from training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from xl.launcher.telemetry.logparse import MAX_EXAMINED, parse_line

FRAMEWORKS = ("transformers", "pytorch_lightning", "lightning", "accelerate", "deepspeed", "torch")


def _start(code: str, **env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("XL_")}
    full.update({"PYTHONPATH": os.pathsep.join(sys.path), **env})
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full,
    )


def _result(proc: subprocess.Popen[str]) -> Any:
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _run(code: str, **env: str) -> Any:
    return _result(_start(code, **env))


# A collector address nobody listens on: the client spools (to no run dir) and never blocks.
_IN_RUN = {"XL_COLLECTOR": "127.0.0.1:9", "XL_TOKEN": "t"}


def test_the_rank_entry_imports_no_framework_ahead_of_the_script() -> None:
    found = _run(
        "import sys, json\n"
        "from xl.launcher.rank import entry, instrument\n"
        "on = instrument.install()\n"
        "loaded = sorted(m for m in sys.modules\n"
        f"                if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(json.dumps({'on': on, 'loaded': loaded}))\n",
        **_IN_RUN,
    )
    assert found == {"on": True, "loaded": []}


IMPORTS = {
    "in-a-run": _IN_RUN,
    "no-instrument": {**_IN_RUN, "XL_INSTRUMENT": "0"},
    "outside-xl": {},
}


@pytest.fixture(scope="module")
def imported() -> dict[str, Any]:
    """Each of IMPORTS' interpreters imports the Trainer, the Accelerator and torch after the hooks,
    all three at once (each spends seconds importing them): what each found patched."""
    procs = {
        name: _start(
            "import json\n"
            "from xl.launcher.rank import instrument\n"
            "instrument.install()\n"
            "from transformers import Trainer\n"
            "from accelerate import Accelerator\n"
            "import torch\n"
            "found = [bool(getattr(c, '_xl_instrumented', False))\n"
            "         for c in (Trainer, Accelerator)]\n"
            "print(json.dumps([*found, bool(getattr(torch, '_xl_steps', False))]))\n",
            **env,
        )
        for name, env in IMPORTS.items()
    }
    try:
        return {name: _result(proc) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.mark.parametrize(
    ("name", "patched"),
    [("in-a-run", True), ("no-instrument", False), ("outside-xl", False)],
    ids=list(IMPORTS),
)
def test_a_trainer_is_patched_when_imported_only_in_an_instrumented_run(
    imported: dict[str, Any], name: str, patched: bool
) -> None:
    assert imported[name] == [patched, patched, patched]  # the Trainer, the Accelerator, torch


def test_a_framework_imported_before_the_hooks_is_patched_too() -> None:
    found = _run(
        "import json\n"
        "import accelerate.accelerator as acc\n"
        "from xl.launcher.rank import instrument\n"
        "instrument.install()\n"
        "print(json.dumps(bool(getattr(acc.Accelerator, '_xl_instrumented', False))))\n",
        **_IN_RUN,
    )
    assert found is True


BAR = "█████     "


@pytest.mark.parametrize(
    "line",
    [
        # HF Trainer's evaluation bar, drawn below the training bar (tqdm then moves the cursor up)
        f"\r 50%|{BAR}| 1/2 [00:00<00:00, 611.15it/s]\x1b[A",
        "\r  0%|          | 0/2 [00:00<?, ?it/s]\x1b[A\r                    \r",
        # Lightning's TQDM bars other than training
        f"Validation DataLoader 0:  50%|{BAR}| 2/4 [00:00<00:00, 42.25it/s]",
        f"Sanity Checking DataLoader 0: 100%|{BAR}| 2/2 [00:00<00:00, 42.25it/s]",
        f"Testing DataLoader 0:  50%|{BAR}| 2/4 [00:00<00:00, 42.25it/s]",
    ],
)
def test_bars_that_are_not_training_are_not_progress(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the training bar beside a nested one still counts
        (
            f" 50%|{BAR}| 3/6 [00:00<00:00, 42.25it/s]",
            {"step": 3, "total_steps": 6, "steps_per_s": 42.25},
        ),
        # Lightning's epoch bar counts on across epochs and has the train_loss the script logged
        (
            f"Epoch 2:  50%|{BAR}| 6/12 [00:00<00:00, 14.15it/s, "
            "v_num=0, train_loss=2.380, val_loss=2.27]",
            {"step": 30, "epoch": 2, "loss": 2.38, "steps_per_s": 14.15},
        ),
        (
            "Epoch 0:  8%|▊         | 1/12 [00:00<00:00, 14.15it/s, train_loss=nan]",
            {
                "step": 1,
                "epoch": 0,
                "loss": None,
                "nonfinite": {"loss": "nan"},
                "steps_per_s": 14.15,
            },
        ),
        # a metric merely named like a loss is not the loss
        (
            f" 50%|{BAR}| 3/6 [00:00<00:00, 4.2it/s, val_loss=1.5]",
            {"step": 3, "total_steps": 6, "steps_per_s": 4.2},
        ),
    ],
)
def test_training_bars_and_their_loss(line: str, expected: dict) -> None:
    assert parse_line(line) == expected


def test_a_long_postfix_costs_a_bounded_read() -> None:
    # digits without end in the postfix: the parser reads the segment's bounded tail, no bar
    line = f"Epoch 1:  50%|{BAR}| 6/12 [00:00<00:00, 1.0it/s, train_loss=" + "9" * 200_000 + "]"
    assert len(line) > 50 * MAX_EXAMINED
    assert parse_line(line) is None


def test_stacked_frameworks_report_once_the_one_closest_to_the_script() -> None:
    """Trainer drives Accelerate, Accelerate drives DeepSpeed: only the top layer logs a step."""
    found = _run(
        "import json\n"
        "from xl.integrations.report import claim\n"
        "print(json.dumps([claim('deepspeed'), claim('accelerate'), claim('deepspeed'),"
        " claim('transformers'), claim('accelerate'), claim('transformers')]))\n"
    )
    assert found == [True, True, False, True, False, True]
