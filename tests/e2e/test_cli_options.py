"""The options of `xl launch`, `xl demo` and `xl sbatch` as a new user (or a torchrun user) types
them, through the real `xl` command: bad input gets one line that says what to do, torchrun's
spellings work, and `xl sbatch` refuses batch scripts that could never run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest
from procs import kill_run, only_run, run_json, wait_no_processes, xl, xl_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkgdir").mkdir()
    return tmp_path


def _one_line_exit_2(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _dry_run(work: Path, *args: str, **env: str) -> dict[str, object]:
    proc = xl(["launch", "--dry-run", "--json", *args], xl_env(work / "home", **env), cwd=work)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("seconds", ["0", "-3", "nan", "inf", "soon"])
def test_demo_refuses_seconds_that_cannot_train(work: Path, seconds: str) -> None:
    line = _one_line_exit_2(xl(["demo", f"--seconds={seconds}"], xl_env(work / "home"), cwd=work))
    assert "--seconds" in line and "number of seconds" in line
    assert not (work / "home" / "runs").exists()  # nothing started


def test_a_near_miss_option_gets_did_you_mean(work: Path) -> None:
    line = _one_line_exit_2(
        xl(["launch", "--gpu", "2", "train.py"], xl_env(work / "home"), cwd=work)
    )
    assert "unknown option --gpu" in line and "did you mean --gpus?" in line


def test_a_directory_given_as_the_script_is_called_a_directory(work: Path) -> None:
    line = _one_line_exit_2(xl(["launch", "--dry-run", "pkgdir"], xl_env(work / "home"), cwd=work))
    assert "pkgdir is a directory" in line and "no such script" not in line


def test_torchrun_spellings_mean_what_they_mean_to_torchrun(work: Path) -> None:
    ours = _dry_run(work, "--nproc", "2", "--rdzv", "127.0.0.1:29555", "train.py")
    for spelling in (
        ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", "29555"],
        ["--nproc_per_node=2", "--master_port=29555"],
        ["--nproc-per-node", "2", "--rdzv-endpoint", "127.0.0.1:29555", "--max-restarts", "0"],
    ):
        assert _dry_run(work, *spelling, "train.py") == ours, spelling
    standalone = _dry_run(
        work, "--standalone", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2",
        "train.py",
    )
    assert standalone == _dry_run(work, "--nproc", "2", "train.py")


@pytest.mark.parametrize(
    ("option", "words"),
    [
        (["--rdzv-backend", "static"], "xl chooses the rendezvous"),
        (["--rdzv_id", "x"], "rendezvous id"),
        (["--tee", "3"], "xl logs"),
        (["--no-python"], "Python script"),
    ],
)
def test_torchrun_options_xl_does_not_take_say_so(
    work: Path, option: list[str], words: str
) -> None:
    line = _one_line_exit_2(xl(["launch", *option, "train.py"], xl_env(work / "home"), cwd=work))
    assert f"torchrun's {option[0]} is not taken here" in line and words in line


def test_max_restarts_reaches_torchrun(work: Path) -> None:
    argv = _dry_run(work, "--max-restarts", "3", "train.py")["argv"]
    assert isinstance(argv, list) and argv[argv.index("--max-restarts") + 1] == "3", argv


def test_python_runs_the_ranks_under_another_interpreter(work: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-python"
    # Another environment's interpreter (with torch: xl checks it has it, dry run included).
    other.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    other.chmod(0o755)
    out = _dry_run(work, "--python", str(other), "train.py", PYTHONPATH="/mine")
    assert out["argv"][:3] == [str(other), "-m", "torch.distributed.run"]  # type: ignore[index]
    # xl's rank code reaches the ranks first on PYTHONPATH, the person's path after it; a dry
    # run only names the folder.
    shim, mine = out["env"]["PYTHONPATH"].split(":")  # type: ignore[index]
    assert shim.startswith(str(work / "home" / "pyshim")) and mine == "/mine"
    assert not (work / "home" / "pyshim").exists()
    line = _one_line_exit_2(
        xl(
            ["launch", "--python", str(tmp_path / "nope"), "train.py"],
            xl_env(work / "home"),
            cwd=work,
        )
    )
    assert "--python" in line and "nope" in line


def test_sbatch_help_lists_only_what_it_takes(work: Path) -> None:
    proc = xl(["sbatch", "--help"], xl_env(work / "home"), cwd=work)
    assert proc.returncode == 0
    listed = set(re.findall(r"^\s+(-[-\w]+)", proc.stdout, re.MULTILINE))
    listed |= set(re.findall(r"^\s+-\w+(?: \w+)?, (--[-\w]+)", proc.stdout, re.MULTILINE))
    assert not listed & {"--detach", "--dry-run", "--json", "--slurm", "--nnodes", "--node-rank"}, (
        listed
    )
    assert {"--nodes", "--cpus-per-task", "--gpus", "--nproc", "--python"} <= listed, listed
    line = _one_line_exit_2(
        xl(["sbatch", "--nnodes", "2", "train.py"], xl_env(work / "home"), cwd=work)
    )
    assert "did you mean --nodes?" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--gpus", "0,1", "--nproc", "8"], "--nproc 8 is more than the 2 GPU(s)"),
        (["--gpus-per-node", "4", "-c", "32", "--nproc", "8"], "--gpus-per-node 4"),
        (["--time", "banana"], "not a Slurm time"),
        (["--mem", "lots"], "not a Slurm memory size"),
    ],
)
def test_sbatch_refuses_scripts_that_cannot_work(work: Path, args: list[str], words: str) -> None:
    proc = xl(["sbatch", *args, "train.py"], xl_env(work / "home"), cwd=work)
    assert words in _one_line_exit_2(proc) and proc.stdout == ""


def test_sbatch_warns_about_gpus_per_node_without_cpus(work: Path) -> None:
    env = xl_env(work / "home")
    bare = xl(
        [
            "sbatch", "-N", "2", "--gpus-per-node", "8", "--time", "1-12:00:00", "--mem", "200G",
            "train.py",
        ],
        env,
        cwd=work,
    )
    assert bare.returncode == 0 and "#SBATCH --gpus-per-node=8" in bare.stdout
    assert "without -c/--cpus-per-task" in bare.stderr and "-c 64" in bare.stderr
    with_c = xl(
        ["sbatch", "-N", "2", "--gpus-per-node", "8", "-c", "64", "train.py"], env, cwd=work
    )
    assert with_c.returncode == 0 and with_c.stderr == ""


def test_unknown_accelerate_gpu_ids_are_blamed_on_the_config(work: Path, simnvml) -> None:
    sim = simnvml(gpus=2)
    config = work / "acc.yaml"
    config.write_text("num_processes: 2\ngpu_ids: 0,7\nmixed_precision: 'no'\n")
    env = xl_env(work / "home", **sim.env)
    line = _one_line_exit_2(
        xl(["launch", "--dry-run", "--accelerate-config", str(config), "train.py"], env, cwd=work)
    )
    assert "gpu_ids in the Accelerate config" in line and "in --gpus" not in line
    # --gpus given beside it wins, and is what an error would name.
    assert (
        xl(
            [
                "launch", "--dry-run", "--accelerate-config", str(config), "--gpus", "1,0",
                "train.py",
            ],
            env,
            cwd=work,
        ).returncode
        == 0
    )
    assert "in --gpus" in _one_line_exit_2(
        xl(
            ["launch", "--dry-run", "--accelerate-config", str(config), "--gpus", "9", "train.py"],
            env,
            cwd=work,
        )
    )


def test_ranks_run_under_another_environment_without_xl(work: Path, tmp_path: Path) -> None:
    """--python PY: torchrun and every rank run under PY (an environment with torch and no xl);
    the rank code xl needs, and xl.log, reach it on PYTHONPATH."""
    other = tmp_path / "other"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=60
    )
    site = next(other.glob("lib/python*/site-packages"))
    # torch (and what it needs) from this environment's site-packages, without its .pth hooks:
    # no editable-install finder, so PY has no `import xl` of its own.
    (site / "torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    py = other / "bin" / "python"
    alone = subprocess.run(
        [str(py), "-c", "import torch, xl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "No module named 'xl'" in alone.stderr
    (work / "logs.py").write_text(
        "import os, sys, xl\nxl.log(step=1, loss=0.25)\nprint('exe', sys.executable)\n"
    )
    home = work / "home"
    proc = xl(
        ["launch", "--no-tui", "--nproc", "2", "--python", str(py), "logs.py"],
        xl_env(home),
        cwd=work,
        timeout=120,
    )
    run_dir = only_run(home)
    try:
        assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr
        run = run_json(run_dir)
        assert run["argv"][0] == str(py) and run["spec"]["python"] == str(py)
        for rank in (0, 1):
            assert f"exe {py}" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        train = [
            json.loads(ln)
            for ln in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"train"' in ln
        ]
        assert sorted(m["rank"] for m in train if m.get("loss") == 0.25) == [0, 1]
        wait_no_processes(run_dir, timeout=3)
        assert not [p for p in psutil.process_iter(["exe"]) if p.info["exe"] == str(py)]
    finally:
        kill_run(run_dir)
