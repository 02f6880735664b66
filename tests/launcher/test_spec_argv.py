"""spec_to_argv is the inverse of `xl launch`'s parser: every command line xl writes means the run.

The launch form's command, node 0's command for the other nodes, the Slurm step and the batch
script are all written by spec_to_argv; here each is parsed back with the parser `xl launch` uses
and must give the very spec it was written from.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from dataclasses import replace

import pytest

from xl.errors import UsageError
from xl.launcher.cli.options import (
    launch_parser,
    spec_from_args,
    spec_from_argv,
    split_argv,
    value_options,
)
from xl.launcher.cli.sbatch import _sbatch_parser, node_launch_argv
from xl.launcher.multinode.join import join_command
from xl.launcher.spec import MIXED_PRECISION, LaunchSpec, parse_env_pairs, spec_to_argv
from xl.tui.launchform import LaunchForm, command, to_spec

UUID = "GPU-8d3c4a57-6f1e-4b2a-9c1d-0123456789ab"


def _here(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` as `xl launch` run in this directory gives it (the cwd is where one types)."""
    return replace(spec, cwd=os.getcwd())


def _round_trip(spec: LaunchSpec) -> LaunchSpec:
    return spec_from_argv(spec_to_argv(spec))


SPECS = {
    "script": LaunchSpec(script="train.py"),
    "gpus_order": LaunchSpec(script="train.py", gpus="2,0", args=["--lr", "3e-4"]),
    "gpus_uuid": LaunchSpec(script="t.py", gpus=f"{UUID},1"),
    "gpus_all_auto": LaunchSpec(script="t.py", gpus="auto:2", nproc=2),
    "gpus_all": LaunchSpec(script="t.py", gpus="all"),
    "module": LaunchSpec(module="pkg.train", args=["--epochs", "3"]),
    "module_args_like_xl_options": LaunchSpec(
        module="pkg.train", args=["--gpus", "7", "-m", "x", "--"]
    ),
    "script_args_like_xl_options": LaunchSpec(
        script="t.py", args=["--nproc", "9", "--env", "A=1", "-m", "m"]
    ),
    "script_named_like_an_option": LaunchSpec(script="-weird.py", args=["--", "x"]),
    "env_spaces_and_equals": LaunchSpec(
        script="t.py", env={"A": "x y", "B": "b=c=d", "C": "", "_D1": "--x"}
    ),
    "name_with_spaces": LaunchSpec(script="t.py", name="my run 1"),
    "name_like_an_option": LaunchSpec(script="t.py", name="--detach"),
    "mixed_precision": LaunchSpec(script="t.py", mixed_precision="bf16"),
    "mixed_precision_no": LaunchSpec(script="t.py", mixed_precision="no"),
    "multinode_node0": LaunchSpec(script="t.py", nnodes=2, rdzv="10.0.0.1:29500", nproc=4),
    "multinode_node3_ipv6": LaunchSpec(
        script="t.py", nnodes=4, node_rank=3, rdzv="[fd00::1]:29500"
    ),
    "another_python": LaunchSpec(script="t.py", python=sys.executable),
    "everything": LaunchSpec(
        module="a.b",
        args=["x", "--y=1"],
        gpus="1,3",
        nproc=2,
        nnodes=2,
        node_rank=1,
        rdzv="h:1",
        mixed_precision="fp16",
        env={"NCCL_DEBUG": "INFO"},
        name="n",
    ),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_spec_to_argv_parses_back_to_the_spec(spec: LaunchSpec) -> None:
    assert _round_trip(spec) == _here(spec)


def _random_spec(rng: random.Random) -> LaunchSpec:
    words = ["a", "b c", "--gpus", "-m", "--", "x=y", "'q'", '"', "$HOME", "-", "--name=z", "é", ""]

    def text() -> str:
        out = "".join(
            rng.choice(["a", " ", "=", "-", ",", ":", "'", "é", "0"])
            for _ in range(rng.randint(1, 8))
        )
        # argparse drops an option's value that is exactly "--", however it is written.
        return "x" if out == "--" else out

    nnodes = rng.choice([1, 1, 2, 8])
    return LaunchSpec(
        script=None if rng.random() < 0.3 else rng.choice(["t.py", "dir/x y.py", "-s.py", "--"]),
        module="pkg.mod",
        args=[rng.choice(words) for _ in range(rng.randint(0, 5))],
        gpus=rng.choice([None, "0", "3,1", "all", "auto:3", UUID, "-1", text()]),
        nproc=rng.choice([None, 1, 8]),
        nnodes=nnodes,
        node_rank=rng.randrange(nnodes),
        rdzv=rng.choice([None, "h:1", "[::1]:5", text()]),
        mixed_precision=rng.choice([None, *MIXED_PRECISION]),
        env={rng.choice(["A", "B_2", "_c"]): text() for _ in range(rng.randint(0, 3))},
        name=rng.choice([None, text()]),
    )


def test_many_random_specs_round_trip() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        spec = _random_spec(rng)
        if spec.script is not None:
            spec.module = None
        assert _round_trip(spec) == _here(spec), spec_to_argv(spec)


def test_defaults_are_left_out_and_the_script_follows_a_separator() -> None:
    assert spec_to_argv(LaunchSpec(script="t.py", args=["--lr", "1"])) == [
        "--",
        "t.py",
        "--lr",
        "1",
    ]
    assert spec_to_argv(LaunchSpec(module="m"), ["--no-tui"]) == ["--no-tui", "-m", "m"]


def test_the_launch_form_shows_a_command_that_parses_to_its_spec() -> None:
    form = LaunchForm(
        target="train.py", args="--lr 3e-4 --name 'a b'", gpus="3,1", nproc="2", nnodes="2",
        node_rank="1", rdzv="h:29500", mixed_precision="bf16", env="NCCL_DEBUG=INFO X='a b=c'",
        name="t1",
    )  # fmt: skip
    argv = command(form)
    assert argv[:2] == ["xl", "launch"]
    assert spec_from_argv(argv[2:]) == _here(to_spec(form))
    # The form reads --env as `xl launch` does: the same names are refused.
    for bad in ("NCCL_DEBUG", "1A=x", "A-B=x"):
        with pytest.raises(UsageError, match="KEY=VALUE"):
            to_spec(replace(form, env=bad))
        with pytest.raises(UsageError, match="is not NAME=VALUE"):
            parse_env_pairs([bad])


def test_the_form_s_command_leaves_out_what_does_not_read_yet() -> None:
    assert command(LaunchForm(target="t.py", nproc="two", gpus="0")) == [
        "xl", "launch", "--gpus", "0", "--", "t.py",
    ]
    assert command(LaunchForm()) == ["xl", "launch"]


def test_the_join_command_runs_the_same_run_as_the_other_node() -> None:
    spec = LaunchSpec(
        script="t.py", args=["--x", "a b"], gpus="0,1", nnodes=3, rdzv="10.0.0.1:29500",
        env={"A": "b c"}, name="r", cwd=os.getcwd(),
    )  # fmt: skip
    text = join_command(spec, 1, "tok-0123456789abcdef", "30001")
    words = shlex.split(text)
    assert words[:2] == ["XL_TOKEN=tok-0123456789abcdef", "XL_COLLECTOR_PORT=30001"]
    assert words[2:4] == ["xl", "launch"]
    assert spec_from_argv(words[4:]) == replace(spec, node_rank=1)
    # A token from the environment is referred to, never written out.
    assert shlex.split(join_command(spec, 2, None, None))[0] == "XL_TOKEN=$XL_TOKEN"


def test_the_slurm_node_command_is_the_run_without_its_nodes(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    parser = _sbatch_parser()
    given = ["--nodes", "2", "--nproc", "4", "--name", "n", "--env", "A=1", "--accelerate-config",
             "--no-tui", "--rdzv", "h:5", "-m", "pkg.train", "--lr", "1"]  # fmt: skip
    opts, script, module, args = split_argv(given, value_options(parser))
    ns = parser.parse_args(opts)
    argv = node_launch_argv(ns, script, module, args, rdzv=ns.rdzv, no_tui=ns.no_tui)
    assert argv == ["--nproc", "4", "--rdzv", "h:5", "--env", "A=1", "--name", "n",
                    "--accelerate-config", "--no-tui", "-m", "pkg.train", "--lr", "1"]  # fmt: skip
    launch = launch_parser()
    opts, script, module, args = split_argv(argv, value_options(launch))
    ns = launch.parse_args(opts)
    assert ns.no_tui and ns.accelerate_config == ""
    assert spec_from_args(ns, script, module, args, read_config=False) == LaunchSpec(
        module="pkg.train",
        args=["--lr", "1"],
        nproc=4,
        rdzv="h:5",
        env={"A": "1"},
        name="n",
        cwd=str(tmp_path),
    )


def test_torchruns_spellings_are_accepted() -> None:
    argv = [
        "--nproc-per-node", "2", "--nnodes", "2", "--node_rank", "1", "--rdzv-endpoint", "h:1",
        "t.py", "--nproc_per_node", "9",
    ]
    assert spec_from_argv(argv) == _here(
        LaunchSpec(
            script="t.py",
            args=["--nproc_per_node", "9"],
            nproc=2,
            nnodes=2,
            node_rank=1,
            rdzv="h:1",
        )
    )
    assert spec_from_argv(["--standalone", "--nproc_per_node=3", "t.py"]).nproc == 3
    with pytest.raises(UsageError, match="--standalone is a one-node run"):
        spec_from_argv(["--standalone", "--nnodes", "2", "t.py"])
