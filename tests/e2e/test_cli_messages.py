"""What a person trips over after the first hour, said right by the real `xl`: near-miss commands,
`python` written before the script, torchrun's --nproc-per-node words and --nnodes MIN:MAX,
--gpus auto, xl sbatch's options and GPUs, xl runs' order as its help says, one rank not "1
ranks", and the --no-tui table at 80 columns."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path

import pytest
from procs import run_dirs, wait_no_processes, xl, xl_env
from rich.console import Console
from where import FIXTURES

from xl.launcher.cli.console import ConsoleRun, render
from xl.launcher.cli.options import cpu_cores

RUNS_FIXTURES = FIXTURES / "runs"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('trained', flush=True)\n")
    return tmp_path


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, (
        proc.returncode,
        proc.stderr,
    )
    return lines[0]


def test_a_mistyped_command_gets_did_you_mean(work: Path) -> None:
    env = xl_env(work / "home")
    assert (
        _one_line(xl(["lauch", "train.py"], env))
        == "xl: unknown command 'lauch'; did you mean launch? (see 'xl --help')"
    )
    far = _one_line(xl(["frobnicate"], env))
    assert "did you mean" not in far and "(commands: doctor, gpus" in far


@pytest.mark.parametrize("python", ["python", "python3", "python3.11"])
def test_python_before_the_script_is_to_be_dropped(work: Path, python: str) -> None:
    env = xl_env(work / "home")
    line = _one_line(xl(["launch", "--dry-run", python, "train.py", "--lr", "1"], env, cwd=work))
    assert (
        line
        == f"xl launch: xl launch runs the script with Python itself: drop '{python}' (xl launch "
        "train.py --lr 1)"
    )
    line = _one_line(xl(["sbatch", python, "-m", "pkg.train"], env, cwd=work))
    assert f"drop '{python}' (xl sbatch -m pkg.train)" in line
    # A script that merely starts with "python" runs.
    (work / "python_train.py").write_text("print('ok')\n")
    assert xl(["launch", "--dry-run", "python_train.py"], env, cwd=work).returncode == 0


def _dry(work: Path, *args: str) -> dict[str, list[str]]:
    done = xl(["launch", "--dry-run", "--json", *args, "train.py"], xl_env(work / "home"), cwd=work)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _nproc(argv: list[str]) -> str:
    return argv[argv.index("--nproc-per-node") + 1]


def test_torchruns_nproc_words_and_nnodes_range_are_taken(work: Path, simnvml) -> None:
    # On CPU (no GPU here): cpu and auto are every core this process may use, as torchrun counts.
    assert _nproc(_dry(work, "--nproc-per-node", "cpu")["argv"]) == str(cpu_cores())
    assert _nproc(_dry(work, "--nproc-per-node", "auto")["argv"]) == str(cpu_cores())
    assert _nproc(_dry(work, "--nproc-per-node", "2", "--nnodes", "1:1")["argv"]) == "2"
    env = xl_env(work / "home")
    assert "--nproc-per-node gpu: no GPU is chosen here" in _one_line(
        xl(["launch", "--dry-run", "--nproc-per-node", "gpu", "train.py"], env, cwd=work)
    )
    assert "give a number of processes, or auto, cpu or gpu" in _one_line(
        xl(["launch", "--dry-run", "--nproc", "many", "train.py"], env, cwd=work)
    )
    line = _one_line(xl(["launch", "--dry-run", "--nnodes", "1:2", "train.py"], env, cwd=work))
    assert "xl runs a fixed number of nodes" in line and "give --nnodes 2" in line
    # With GPUs (the simulated driver): gpu and auto are one rank per chosen GPU.
    sim = simnvml(gpus=3)
    env = {**xl_env(work / "home"), **sim.env}
    for word in ("gpu", "auto"):
        done = xl(
            ["launch", "--dry-run", "--json", "--nproc-per-node", word, "train.py"], env, cwd=work
        )
        assert done.returncode == 0 and _nproc(json.loads(done.stdout)["argv"]) == "3", done.stderr



def test_gpus_auto_is_every_free_gpu(work: Path, simnvml, simnvml_gpu) -> None:
    busy = simnvml_gpu(util_gpu=90, memory_used_mib=30_000)
    sim = simnvml(gpus=[simnvml_gpu(), busy, simnvml_gpu()])
    env = {**xl_env(work / "home"), **sim.env}
    done = xl(["launch", "--dry-run", "--json", "--gpus", "auto", "train.py"], env, cwd=work)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["env"]["CUDA_VISIBLE_DEVICES"] == "0,2" and _nproc(out["argv"]) == "2"
    sim = simnvml(gpus=[busy, busy])
    env = {**xl_env(work / "home"), **sim.env}
    line = _one_line(xl(["launch", "--dry-run", "--gpus", "auto", "train.py"], env, cwd=work))
    assert (
        line.startswith("xl launch: --gpus auto: no free GPU here (GPU 0 is 90% busy")
        and "--gpus all" in line
    )
    # what it suggests works
    assert xl(["launch", "--dry-run", "--gpus", "all", "train.py"], env, cwd=work).returncode == 0


def test_sbatch_says_what_it_does_not_take_and_when_it_asks_for_no_gpu(work: Path) -> None:
    env = xl_env(work / "home")
    line = _one_line(xl(["sbatch", "--detach", "train.py"], env, cwd=work))
    assert "--sbatch" not in line and "a batch job runs detached already" in line
    assert "Slurm gives each node its rank" in _one_line(
        xl(["sbatch", "--node-rank", "1", "train.py"], env, cwd=work)
    )
    bare = xl(["sbatch", "--nodes", "2", "train.py"], env, cwd=work)
    assert bare.returncode == 0 and "#SBATCH" in bare.stdout
    assert "warning: no --gpus-per-node: the job requests no GPUs" in bare.stderr
    gpus = xl(
        ["sbatch", "--nodes", "2", "--gpus-per-node", "4", "-c", "16", "train.py"], env, cwd=work
    )
    assert gpus.returncode == 0 and "no --gpus-per-node" not in gpus.stderr
    gres = xl(["sbatch", "--sbatch=--gres=gpu:4", "train.py"], env, cwd=work)
    assert gres.returncode == 0 and "no --gpus-per-node" not in gres.stderr


@pytest.mark.e2e
def test_runs_json_order_is_what_its_help_says_and_one_rank_reads_one_rank(work: Path) -> None:
    env = xl_env(work / "home")
    for name in ("first", "second"):
        done = xl(["launch", "--no-tui", "--name", name, "train.py"], env, cwd=work, timeout=120)
        assert done.returncode == 0, done.stderr
        time.sleep(1.1)  # run ids and start times in whole seconds
    helped = xl(["runs", "--help"], env).stdout
    assert "--json lists them oldest first" in " ".join(helped.split())
    names = [r["name"] for r in json.loads(xl(["runs", "--json"], env).stdout)]
    assert names == ["first", "second"]  # oldest first, as the help says
    text = xl(["runs"], env).stdout.splitlines()
    assert text[1].split()[1] == "second" and text[2].split()[1] == "first"  # newest first
    run_dir = run_dirs(work / "home")[-1]
    started = [
        json.loads(x)
        for x in (run_dir / "events.jsonl").read_text().splitlines()
        if '"run_started"' in x
    ]
    assert started[0]["message"] == "starting 1 rank on CPU"
    wait_no_processes(run_dir, timeout=10)


def test_the_no_tui_table_keeps_each_state_on_one_line_at_80_columns() -> None:
    watched = ConsoleRun(RUNS_FIXTURES / "20260530-failed")
    watched.poll()
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render(watched))
    rows = [ln for ln in buf.getvalue().splitlines() if ln.startswith("│")]
    assert len(rows) == 2, buf.getvalue()  # one line per rank: nothing wrapped onto a second
    assert "stopped (-15)" in rows[0] and "failed (1)" in rows[1]
    assert max(len(ln) for ln in buf.getvalue().splitlines()) <= 80
