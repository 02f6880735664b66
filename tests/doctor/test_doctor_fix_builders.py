"""The fix builders are plain functions of the few facts they need: the command a person runs is
made from them alone, and what it does to the facts (to try it against every check) comes
beside it. Each is checked for the broken case it must fix and a healthy-but-unusual one it
must leave as it is."""

from __future__ import annotations

from xl.doctor.checks.fixes import toolkit_candidates, torch_candidates
from xl.doctor.checks.ldpath import ld_command
from xl.doctor.facts import Facts, LdEntry, Toolkit
from xl.doctor.wheels import TAG_CUDA

TK = Toolkit(
    root="/usr/local/cuda-12.4",
    real="/usr/local/cuda-12.4",
    version="12.4.1",
    lib_dirs=["/usr/local/cuda-12.4/lib64"],
)


def test_ld_command_drops_other_toolkits_runtimes_missing_folders_and_the_dropped() -> None:
    entries = [
        LdEntry("/opt/cuda-11.8/lib64", real="/opt/cuda-11.8/lib64", cudart=["libcudart.so.11"]),
        LdEntry("/opt/mylibs", real="/opt/mylibs"),
        LdEntry("/gone", real="/gone", exists=False),
        LdEntry("/opt/old-nccl", real="/opt/old-nccl", nccl=["libnccl.so.2"]),
        LdEntry("/opt/mylibs", real="/opt/mylibs"),  # twice: once is enough
    ]
    assert ld_command(entries, {"/opt/old-nccl"}, TK) == (
        "export LD_LIBRARY_PATH=/usr/local/cuda-12.4/lib64:/opt/mylibs"
    )
    # Nothing left to keep, and no toolkit in use: the variable goes.
    assert ld_command(entries[:1] + entries[2:3], set(), None) == "unset LD_LIBRARY_PATH"


def test_ld_command_keeps_a_healthy_path_as_it_is() -> None:
    """The toolkit's own folder already there, under another name, after the user's own: kept in
    the user's order, nothing added."""
    entries = [
        LdEntry("/opt/mylibs", real="/opt/mylibs"),
        LdEntry(
            "/usr/local/cuda/lib64", real="/usr/local/cuda-12.4/lib64", cudart=["libcudart.so.12"]
        ),
    ]
    assert ld_command(entries, set(), TK) == (
        "export LD_LIBRARY_PATH=/opt/mylibs:/usr/local/cuda/lib64"
    )


def test_torch_candidates_are_the_index_commands_and_their_effect() -> None:
    tag = sorted(TAG_CUDA)[-1]
    ((command, apply),) = torch_candidates("/venv/bin/python", None, [tag])
    assert command.startswith("/venv/bin/python -m pip install --force-reinstall torch")
    assert command.endswith(f"--index-url https://download.pytorch.org/whl/{tag}")
    after = apply(Facts(env={}, python="/venv/bin/python"))
    assert after.what_if and after.torch is not None and after.torch.cuda == TAG_CUDA[tag]
    assert torch_candidates("/venv/bin/python", "2.5.1+cpu", []) == []


def test_toolkit_candidates_export_each_toolkit_and_point_the_facts_at_it() -> None:
    ((command, apply),) = toolkit_candidates([TK])
    assert command == "export CUDA_HOME=/usr/local/cuda-12.4 PATH=/usr/local/cuda-12.4/bin:$PATH"
    after = apply(Facts(env={"CUDA_HOME": "/usr/local/cuda-11.8"}, python="python3"))
    assert after.env["CUDA_HOME"] == TK.root and after.cuda_home_dir is TK and after.what_if
