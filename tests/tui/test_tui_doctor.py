"""Doctor screen: the real run_doctor in a worker, worst first, the chosen check's fix, re-run."""

from __future__ import annotations

from pilotwait import until
from textual.widgets import DataTable, Static

from xl.tui.app import build_app

ORDER = ["fail", "error", "warn", "ok", "skip"]


async def test_doctor_lists_checks_worst_first_and_shows_the_fix(simnvml, monkeypatch, tmp_path):
    # One GPU hidden by a CUDA_VISIBLE_DEVICES that names a GPU that does not exist: a finding
    # with a fix, whatever else this machine has.
    sim = simnvml(gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setenv("XL_CONFIG_HOME", str(tmp_path))
    with sim.in_process():
        app = build_app(poll_interval=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("2")
            await until(pilot, lambda: app.screen.id == "doctor", "doctor screen")
            table = app.screen.query_one("#doctor-table", DataTable)
            await until(pilot, lambda: table.row_count > 10, "checks listed")
            statuses = [str(table.get_cell_at((r, 0))).lower() for r in range(table.row_count)]
            assert statuses == sorted(statuses, key=ORDER.index)  # worst first
            keys = [
                table.coordinate_to_cell_key((r, 0)).row_key.value for r in range(table.row_count)
            ]
            assert "cuda_visible_devices" in keys
            table.move_cursor(row=keys.index("cuda_visible_devices"))
            await pilot.pause()
            detail = str(app.screen.query_one("#doctor-detail", Static).render())
            check = app.screen.checks["cuda_visible_devices"]
            assert check.status in ("fail", "warn")
            assert check.detail in detail
            assert "Fix:" in detail and check.fix in detail
            summary = str(app.screen.query_one("#doctor-summary", Static).render())
            assert "Overall" in summary

            # Re-run after fixing the variable: the check turns ok.
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
            await pilot.press("r")
            await until(
                pilot,
                lambda: app.screen.checks["cuda_visible_devices"].status in ("ok", "skip"),
                "cuda_visible_devices ok after the re-run",
            )
