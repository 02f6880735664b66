"""Direct tests of what the checks share (split from the former checks/common.py): the Finding
constructors (finding), what several checks read off the facts (derived), which toolkit a fix
names (toolkit_choice), and fixes tried before they are printed (fixes)."""

from __future__ import annotations

import sys
from dataclasses import replace

from xl.doctor.checks.derived import (
    home_cuda,
    nvcc_versions,
    on_host,
    python_of,
    torch_cuda,
    working_gpus,
)
from xl.doctor.checks.finding import fail, ok, skip
from xl.doctor.checks.fixes import first_safe, with_toolkit, with_torch
from xl.doctor.checks.toolkit_choice import (
    export_toolkit,
    preferred_toolkit,
    toolkit_choices,
    toolkit_with,
    usable,
)
from xl.doctor.facts import CmdResult, Facts, Toolkit, TorchInfo
from xl.gpu.inventory import empty_gpu


def facts(**kw: object) -> Facts:
    return Facts(**{"env": {}, "python": sys.executable, **kw})  # type: ignore[arg-type]


def toolkit(
    root: str, version: str, *, headers: bool = True, problem: str | None = None
) -> Toolkit:
    return Toolkit(
        root=root,
        real=root,
        version=version,
        nvcc=f"{root}/bin/nvcc",
        has_headers=headers,
        problem=problem,
    )


def torch(cuda: str | None) -> TorchInfo:
    return TorchInfo(python="/envs/t/bin/python", found=True, version="2.4.0", cuda=cuda)


def nvcc(release: str) -> CmdResult:
    return CmdResult(
        ["nvcc", "--version"], stdout=f"Cuda compilation tools, release {release}, V{release}.1"
    )


# -- finding -----------------------------------------------------------------------------------


def test_each_constructor_sets_its_status_and_a_fresh_data() -> None:
    a, b = ok("fine"), skip("n/a")
    assert (a.status, b.status, fail("bad", fix="do x").fix) == ("ok", "skip", "do x")
    a.data["k"] = 1
    assert b.data == {} and ok("x", data={"v": 2}).data == {"v": 2}


# -- derived -----------------------------------------------------------------------------------


def test_torch_cuda_only_for_a_cuda_build() -> None:
    assert torch_cuda(facts(torch=torch("12.4"))) == "12.4"
    assert torch_cuda(facts(torch=torch(None))) is None
    assert torch_cuda(facts()) is None


def test_python_of_is_the_probe_s_interpreter() -> None:
    assert python_of(facts(torch=torch("12.4"))) == "/envs/t/bin/python"
    assert python_of(facts()) == sys.executable


def test_nvcc_versions_and_the_cuda_torch_would_build_with() -> None:
    f = facts(cuda_home="/cuda", cuda_home_nvcc_run=nvcc("12.4"), path_nvcc_run=nvcc("12.6"))
    assert nvcc_versions(f, "home") == ("12.4", "12.4.1")
    assert nvcc_versions(f, "path") == ("12.6", "12.6.1")
    assert home_cuda(f) == ("12.4", "/cuda/bin/nvcc")
    # No CUDA_HOME: torch's builder falls back to PATH's nvcc.
    assert home_cuda(facts(path_nvcc="/bin/nvcc", path_nvcc_run=nvcc("12.6"))) == (
        "12.6",
        "/bin/nvcc",
    )
    assert home_cuda(facts()) == (None, "")


def test_working_gpus_leave_the_lost_out() -> None:
    gpus = (empty_gpu(0, error="", name="A"), empty_gpu(1, error="gone", lost=True))
    assert [g.index for g in working_gpus(facts(gpus=gpus))] == [0]


def test_a_driver_fix_in_a_container_is_for_the_host() -> None:
    assert on_host(facts(), "install it") == "install it"
    inside = facts(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    said = on_host(inside, "install it")
    assert said == "install it" and said.note == "run it on the host, not in this container"


# -- toolkit_choice ----------------------------------------------------------------------------


def test_toolkit_with_prefers_complete_ones_named_for_their_version() -> None:
    bare, named, wheel = (
        toolkit("/usr/local/cuda", "12.4.1"),
        toolkit("/usr/local/cuda-12.4", "12.4.1"),
        toolkit("/pip/nvcc", "12.4.99", headers=False),
    )
    f = facts(toolkits=[wheel, bare, named])
    assert toolkit_with(f, "12.4") is named
    assert toolkit_with(f, "12.6") is None


def test_fixes_point_at_torch_s_cuda_first() -> None:
    old, new, broken = (
        toolkit("/cuda-11.8", "11.8.89"),
        toolkit("/cuda-12.4", "12.4.1"),
        toolkit("/cuda-12.6", "12.6.2", problem="unreadable"),
    )
    f = facts(toolkits=[old, new, broken], torch=torch("12.4"), home_toolkit="/cuda-11.8")
    assert not usable(broken)
    assert toolkit_choices(f) == [new, old]
    assert toolkit_choices(f, exclude="/cuda-12.4") == [old]
    assert preferred_toolkit(f) is new
    # torch without CUDA: the toolkit CUDA_HOME selects.
    assert preferred_toolkit(replace(f, torch=torch(None))) is old
    assert export_toolkit(new) == "export CUDA_HOME=/cuda-12.4 PATH=/cuda-12.4/bin:$PATH"


# -- fixes -------------------------------------------------------------------------------------


def test_applied_fixes_change_only_the_facts_they_name() -> None:
    tk = toolkit("/cuda-12.4", "12.4.1")
    after = with_toolkit(tk)(facts(torch=torch("12.4")))
    assert (
        after.what_if and after.cuda_home == "/cuda-12.4" and after.env["CUDA_HOME"] == "/cuda-12.4"
    )
    assert nvcc_versions(after, "path") == ("12.4", "12.4.1") == nvcc_versions(after, "home")
    t = with_torch("cu126", "2.6.0")(facts(torch=torch(None))).torch
    assert t is not None and (t.version, t.cuda, t.found) == ("2.6.0+cu126", "12.6", True)


def test_first_safe_skips_fixes_that_fail_or_break_another_check() -> None:
    def recheck(f: Facts) -> dict[str, str]:
        home = f.cuda_home or ""
        return {
            "me": "ok" if home.endswith("good") else "fail",
            "other": "fail" if "breaks" in home else "ok",
        }

    cands = [
        (f"export {name}", with_toolkit(toolkit(f"/{name}", "12.4.1")))
        for name in ("bad", "breaks-good", "good")
    ]
    assert first_safe(facts(), "me", cands) == "export bad"  # no recheck: the first stands
    assert first_safe(facts(recheck=recheck), "me", cands) == "export good"
    assert first_safe(facts(recheck=recheck, what_if=True), "me", cands) == "export bad"
    assert first_safe(facts(recheck=recheck), "me", cands[:2]) is None
    assert first_safe(facts(recheck=recheck), "me", []) is None
