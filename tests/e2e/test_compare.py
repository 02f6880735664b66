"""Time accounting and `xl compare` on real runs: gloo CPU ranks started by the real `xl launch`,
compared by the real `xl compare`.

Five runs start at once (one module fixture, to keep the suite short). Each differs from the
base run in one thing: an environment variable (and secrets beside it), an argument, the number
of ranks, or a rank that stalls for a known time (tests/support/stall_ddp.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import XL, kill_run, run_json, wait_final, wait_no_processes, xl, xl_env
from where import SUPPORT

pytestmark = pytest.mark.e2e

SCRIPT = SUPPORT / "stall_ddp.py"
STALL_S = 8.0
# run.json's time: total_s, these parts (summing to it), and phases where the steps were timed.
PARTS = ("startup_s", "training_s", "stalled_s", "restarts_s", "shutdown_s")
# Secrets, masked in every output; FOO is an ordinary variable, shown.
SECRETS = {
    "HF_TOKEN": ("hf_aaaaaaaa", "hf_bbbbbbbb"),
    "DB_PASSWORD": ("pw-one-1", "pw-two-2"),
    "AWS_SECRET_ACCESS_KEY": ("sak-1111", "sak-2222"),
}
BASE = ["--steps", "160"]
# Rank 1 sleeps before step 130: a few seconds after the first step, so the telemetry watches
# every rank well before (a rank's first lines may wait in its spool while the machine is loaded).
STALL = ["--stall-at", "130", "--stall-s", str(STALL_S)]


def _launch(
    name: str, args: list[str], *, nproc: int = 2, extra_env: dict[str, str] | None = None
) -> list[str]:
    envs = [f"--env={k}={v}" for k, v in (extra_env or {}).items()]
    return [
        *XL, "launch", "--no-tui", "--nproc", str(nproc), "--name", name, *envs, str(SCRIPT), *BASE,
        *args,
    ]


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, str], dict[str, Path], dict[str, str]]]:
    home = tmp_path_factory.mktemp("compare-home")
    # A stall is called after 3 s without progress (the default is 30 s).
    env = xl_env(home, XL_STALL_MIN_S="3")
    a_env = {"FOO": "1", "PLAIN": "same", **{k: v[0] for k, v in SECRETS.items()}}
    b_env = {"FOO": "2", "PLAIN": "same", **{k: v[1] for k, v in SECRETS.items()}}
    plans = {
        "base": _launch("base", [], extra_env=a_env),
        "env": _launch("env", [], extra_env=b_env),
        "args": _launch("args", ["--lr", "0.05"], extra_env=a_env),
        "nproc": _launch("nproc", [], nproc=1, extra_env=a_env),
        "stalled": _launch("stalled", STALL, extra_env=a_env),
    }
    procs = {
        name: subprocess.Popen(
            argv, env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, argv in plans.items()
    }
    outputs: dict[str, str] = {}
    dirs: dict[str, Path] = {}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=240)
            outputs[name] = out
            assert proc.returncode == 0, out[-2000:]
        for run in json.loads(xl(["runs", "--json"], env).stdout):
            dirs[run["name"]] = Path(run["run_dir"])
        assert sorted(dirs) == sorted(plans)
        for run_dir in dirs.values():
            wait_final(run_dir, timeout=60)
        yield env, dirs, outputs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        for run_dir in dirs.values():
            kill_run(run_dir)
        for run_dir in dirs.values():
            wait_no_processes(run_dir, timeout=30)


def _compare(env: dict[str, str], a: Path, b: Path) -> dict[str, Any]:
    done = xl(["compare", a.name, b.name, "--json"], env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _changed(doc: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {c["what"]: (c["a"], c["b"]) for c in doc["changed"]}


# ---------------------------------------------------------------------------------- the accounting
def test_every_run_has_its_time_split_into_parts_that_sum_to_its_length(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    listed = {r["name"]: r for r in json.loads(xl(["runs", "--json"], env).stdout)}
    for name, run_dir in dirs.items():
        run = run_json(run_dir)
        t = run["time"]
        # The five parts, and `phases`: where the ranks' timed steps went (xl launch times them).
        assert set(t) == {"total_s", *PARTS, "phases"}, t
        assert abs(sum(t[k] for k in PARTS) - t["total_s"]) < 0.01, t
        phases = t["phases"]
        assert set(phases) == {"data_s", "compute_s", "comm_s", "other_s", "steps_s"}, phases
        assert (
            abs(sum(v for k, v in phases.items() if k != "steps_s") - phases["steps_s"]) < 0.01
        ), phases
        # Each step counted once: the hooks' split-only lines (no `step`) beside the script's own
        # xl.log(step=...) are the same steps, not more of them.
        split = listed[name]["split"]
        assert sorted(split) == [str(r) for r in range(len(run["ranks"]))], split
        assert all(s["steps"] == 160 for s in split.values()), split
        assert t["total_s"] == pytest.approx(run["ended_at"] - run["started_at"], abs=0.01)
        assert t["startup_s"] > 0 and t["training_s"] > 0 and t["restarts_s"] == 0, (name, t)
        assert listed[name]["time"] == t  # `xl runs --json` shows the same accounting


def test_a_rank_stalled_for_a_known_time_shows_that_time(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, outputs = runs
    stalled, base = run_json(dirs["stalled"]), run_json(dirs["base"])
    # From the last step before rank 1 slept to the first step after it: the sleep, plus one
    # step's own work and pause (~0.03 s here), plus what a loaded machine adds to a step; the
    # lower bound is exact (no step can come back before the sleep is over).
    assert STALL_S <= stalled["time"]["stalled_s"] <= STALL_S + 1.5, stalled["time"]
    assert base["time"]["stalled_s"] == 0.0, base["time"]
    # xl.watch measured the wait: rank 0 waited out rank 1's sleep at the all-reduce; rank 1,
    # which slept outside it, hardly waited.
    waited = {r["rank"]: r["waited_s"] for r in stalled["ranks"]}
    assert waited[0] >= STALL_S - 0.5 and waited[1] < 2.0, waited
    assert all(r["waited_s"] < 2.0 for r in base["ranks"]), base["ranks"]
    # The plain view ends with the accounting in one line, then where the steps' time went.
    line, steps = outputs["stalled"].strip().splitlines()[-2:]
    assert line.startswith("time: startup ") and ", stalled " in line and "shutdown" in line, line
    assert steps.startswith("time in steps (") and " comm " in steps, steps
    assert ", stalled " not in outputs["base"].strip().splitlines()[-2]
    # `xl attach` on the finished run ends with the same lines.
    attached = xl(["attach", dirs["stalled"].name], env, timeout=60)
    assert attached.returncode == 0 and attached.stdout.strip().splitlines()[-2:] == [
        line,
        steps,
    ], attached.stdout[-500:]


# ---------------------------------------------------------------------------------- xl compare
def test_an_env_change_is_named_and_secrets_are_masked(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    doc = _compare(env, dirs["base"], dirs["env"])
    assert doc["runs"] == [dirs["base"].name, dirs["env"].name]
    changed = _changed(doc)
    assert changed == {"env.FOO": ("1", "2"), **{f"env.{k}": ("****", "****") for k in SECRETS}}
    text = xl(["compare", dirs["base"].name, dirs["env"].name], env, timeout=60)
    assert text.returncode == 0, text.stderr
    for out in (text.stdout, json.dumps(doc)):
        for values in SECRETS.values():
            assert not any(v in out for v in values), "a secret's value is shown"
    # The side-by-side table names both runs and shows the ordinary variable's values.
    head = text.stdout.splitlines()[1]
    assert dirs["base"].name in head and dirs["env"].name in head
    foo = next(line for line in text.stdout.splitlines() if line.strip().startswith("env.FOO"))
    assert foo.split()[1:] == ["1", "2"], foo


def test_an_argument_change_and_its_effect_on_the_loss(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    doc = _compare(env, dirs["base"], dirs["args"])
    assert _changed(doc) == {"args": (BASE, [*BASE, "--lr", "0.05"])}
    loss = doc["loss"]
    assert loss["steps"] == list(range(1, 161))
    # The same seed and data: the same first loss; another learning rate: another loss after.
    assert loss["a"][0] == pytest.approx(loss["b"][0]) and loss["a"][2] != pytest.approx(
        loss["b"][2], rel=1e-3
    )
    speed = doc["speed"]
    for side in ("a", "b"):
        assert speed[side]["step_s"] > 0 and speed[side]["samples_per_s"] > 0
    assert speed["ratio"] == pytest.approx(
        speed["b"]["samples_per_s"] / speed["a"]["samples_per_s"], rel=1e-3
    )
    assert set(doc["time"]) == {"a", "b"} and doc["time"]["a"] == run_json(dirs["base"])["time"]


def test_a_change_in_the_number_of_ranks(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    assert _changed(_compare(env, dirs["base"], dirs["nproc"])) == {"nproc": (2, 1)}


def test_the_versions_are_recorded_and_the_same_runs_show_no_change(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    versions = run_json(dirs["base"])["versions"]
    import torch  # noqa: PLC0415 - only to check the version recorded without importing it

    assert versions["torch"] == torch.__version__ and versions["xl"]
    assert _changed(_compare(env, dirs["stalled"], dirs["base"])) == {
        "args": ([*BASE, *STALL], BASE)
    }


def test_bad_input_is_one_line_and_exit_2(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]], tmp_path: Path
) -> None:
    env, dirs, _ = runs
    base = dirs["base"].name
    damaged = dirs["base"].parent / "20000101-000000-damaged"
    damaged.mkdir()
    (damaged / "run.json").write_text('{"run_id": "20000101-0000')
    for args, says in (
        (["nosuchrun", base], "no run matches"),
        ([base, base], "give two different runs"),
        ([base, damaged.name], "damaged"),
        ([base], "the following arguments are required"),
    ):
        done = xl(["compare", *args], env, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_run_without_its_digest_is_compared_all_the_same(
    runs: tuple[dict[str, str], dict[str, Path], dict[str, str]],
) -> None:
    env, dirs, _ = runs
    kept = _compare(env, dirs["base"], dirs["args"])
    digest_file = dirs["args"] / "digest.json"
    digest_file.unlink()  # an older xl's run, or one whose end could not write it
    assert _compare(env, dirs["base"], dirs["args"]) == kept
    assert digest_file.exists()  # made from metrics.jsonl and events.jsonl, and kept for next time


# ------------------------------------------------------------------------- what changed, on records
def _record(**over: Any) -> Any:
    from xl.launcher.rundir.runrecord import RunRecord  # noqa: PLC0415 - only these record-level tests build one

    data: dict[str, Any] = {
        "spec": {"script": "train.py", "args": ["--lr", "0.1"], "python": None},
        "env": {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "devices": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3"},
            {"index": 1, "name": "NVIDIA H100 80GB HBM3"},
        ],
        "nproc_per_node": 2,
        "nnodes": 1,
        "versions": {
            "xl": "0.1.0",
            "torch": "2.13.0+cu130",
            "cuda": "13.0",
            "driver": "580.65.06",
            "git": "abc",
        },
    }
    for key, value in over.items():
        data[key] = value if not isinstance(value, dict) else {**data.get(key, {}), **value}
    return RunRecord("r", "succeeded", data)


def test_gpus_their_models_and_versions_are_named_when_they_change() -> None:
    from xl.launcher.view.comparison import changed  # noqa: PLC0415 - a pure function of two records

    a = _record()
    b = _record(
        devices=[
            {"index": 2, "name": "NVIDIA A100-SXM4-80GB"},
            {"index": 3, "name": "NVIDIA A100-SXM4-80GB"},
        ],
        versions={"driver": "550.54.15", "torch": "2.12.0+cu128", "cuda": "12.8", "git": "def+"},
    )
    got = {c["what"]: (c["a"], c["b"]) for c in changed(a, b)}
    assert got == {
        "gpus": ([0, 1], [2, 3]),
        "gpu_models": (["NVIDIA H100 80GB HBM3"] * 2, ["NVIDIA A100-SXM4-80GB"] * 2),
        "torch": ("2.13.0+cu130", "2.12.0+cu128"),
        "cuda": ("13.0", "12.8"),
        "driver": ("580.65.06", "550.54.15"),
        "git": ("abc", "def+"),
    }
    assert changed(a, _record()) == []  # the same spec: nothing to say


@pytest.mark.parametrize(
    ("name", "masked"),
    [
        ("WANDB_API_KEY", True), ("HF_TOKEN", True), ("DB_PASSWORD", True),
        ("AWS_SECRET_ACCESS_KEY", True), ("OMP_NUM_THREADS", False), ("LR", False),
    ],
)
def test_a_secret_is_masked_and_an_ordinary_variable_shown(name: str, masked: bool) -> None:
    from xl.launcher.view.comparison import changed  # noqa: PLC0415 - a pure function of two records

    got = changed(_record(env={name: "value-one"}), _record(env={name: "value-two"}))
    assert got == [
        {
            "what": f"env.{name}",
            "a": "****" if masked else "value-one",
            "b": "****" if masked else "value-two",
        }
    ]
    # Set in one run only: listed, still masked.
    only = changed(_record(env={name: "value-one"}), _record())
    assert [c["what"] for c in only] == [f"env.{name}"] and only[0]["b"] is None
    assert (only[0]["a"] == "****") is masked
