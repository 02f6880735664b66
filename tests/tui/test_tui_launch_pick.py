"""The Launch screen leaves the GPUs screen's pick as the person left it (none: every GPU), a
remembered launch's GPUs coming back only when its script is typed; its mixed-precision control
says all it does (sets ACCELERATE_MIXED_PRECISION, which only Accelerate reads), and that is all
the plan changes."""

from __future__ import annotations

import pytest
from pilotwait import until
from simnvml import SimGPU
from textual.widgets import Input, Label, Select, Static

from xl.tui import settings
from xl.tui.app import build_app
from xl.tui.launchform import LaunchForm, to_spec

HINT = "Accelerate only: sets ACCELERATE_MIXED_PRECISION"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XL_HOME", str(tmp_path / "xlhome"))
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    # train.py was last launched on GPUs 1 and 3: the form opens on it.
    settings.remember("train.py", LaunchForm(target="train.py", nproc="2", gpus="1,3").to_dict())


@pytest.fixture
def four_gpus(simnvml):
    sim = simnvml(gpus=[SimGPU(), SimGPU(), SimGPU(), SimGPU()])
    with sim.in_process():
        yield sim


def text_of(app, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def visit_launch_and_back(app, pilot) -> str:
    """Launch, then the GPUs screen again; what Launch's GPUs field held."""
    await pilot.press("3")
    await until(pilot, lambda: app.screen.id == "launch", "the Launch screen")
    await until(pilot, lambda: "ready" in text_of(app, "#launch-validation"), "its verdict")
    field = app.screen.query_one("#gpus", Input).value
    await pilot.press("escape", "1")
    await until(pilot, lambda: app.screen.id == "gpus", "the GPUs screen")
    return field


@pytest.mark.parametrize(
    ("keys", "pick"),
    [((), []), (("down", "down", "space", "up", "up", "space"), [2, 0])],
    ids=["no pick", "2,0 picked"],
)
async def test_visiting_launch_leaves_the_pick_as_the_person_left_it(four_gpus, keys, pick):
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4, "4 GPUs")
        await pilot.press(*keys)
        assert app.selection.order == pick
        for _ in range(2):  # the first visit makes the form, the second finds it
            field = await visit_launch_and_back(app, pilot)
            assert app.selection.order == pick and field == ",".join(map(str, pick))
            panel = text_of(app, "#cvd")
            assert ("No GPU picked" in panel) if not pick else ("CUDA_VISIBLE_DEVICES=2,0" in panel)


async def test_typing_a_remembered_script_brings_back_its_gpus(four_gpus):
    """The person's act: Script typed again (emptied, then named) brings its settings back, its
    GPUs too, and the picker shows them (one selection)."""
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4, "4 GPUs")
        await pilot.press("3")
        await until(pilot, lambda: app.screen.id == "launch", "the Launch screen")
        target = app.screen.query_one("#target", Input)
        target.value = ""
        await pilot.pause()
        target.value = "train.py"
        gpus = app.screen.query_one("#gpus", Input)
        await until(pilot, lambda: gpus.value == "1,3", "train.py's GPUs")
        assert app.selection.order == [1, 3]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_mixed_precision_says_it_only_sets_accelerate_s_variable(four_gpus, size):
    app = build_app(poll_interval=0.2)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.screen.query_one("#gpu-table").row_count == 4, "4 GPUs")
        await pilot.press("3")
        await until(pilot, lambda: app.screen.id == "launch", "the Launch screen")
        hint = app.screen.query_one(".form-hint", Label)
        await until(pilot, lambda: hint.size.width > 0, "the hint laid out")
        rows = range(hint.size.height)
        shown = " ".join("".join(s.text for s in hint.render_line(y)) for y in rows)
        assert " ".join(shown.split()) == HINT  # whole, wrapped or not
        # Beside the control, on the rows it takes.
        select = app.screen.query_one("#mixed_precision", Select)
        assert hint.region.x >= select.region.right
        assert select.region.y <= hint.region.y < select.region.bottom
        form = app.screen.form()
        plain = app.backend.plan(to_spec(form))
        form.mixed_precision = "bf16"
        bf16 = app.backend.plan(to_spec(form))
        changed = {k for k in {*plain.env, *bf16.env} if plain.env.get(k) != bf16.env.get(k)}
        assert changed == {"ACCELERATE_MIXED_PRECISION"}
        assert bf16.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and bf16.argv == plain.argv
