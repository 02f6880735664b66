"""Screens and widgets reach the domain only through typed views and the backend.

The app's one way to the domain is the Backend protocol (tui/backend.py): everything that reads
a file, asks a process or starts a run goes through it. Screens and widgets draw what it hands
them, so what they import from ``xl.launcher`` and ``xl.doctor`` is:

- at run time, only the typed view of a run (VIEWS: ``launcher/view/runview.py``, where every
  state, hang and failure is decided once; docs/architecture.md, "Layers");
- for type hints (under ``TYPE_CHECKING``), only the typed records the backend and the views hand
  over (TYPES).

An import inside a function counts as a run-time one. Anything else (a reader, the store, the
control of a run) would let a screen do I/O behind the backend's back, or decide again what the
view decided: the fix is a method of the backend or a field of the view.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = ("xl.launcher", "xl.doctor")
VIEWS = frozenset({"xl.launcher.view.runview"})
TYPES = VIEWS | {
    "xl.doctor.report",  # Report: the doctor's verdict (Backend.doctor_report)
    "xl.launcher.view.comparison",  # Comparison (Backend.compare)
    "xl.launcher.rundir.outcome",  # Failure: RunView.failure
    "xl.launcher.view.reader",  # RunReader: what Backend.reader hands the Monitor
    "xl.launcher.rundir.runrecord",  # RunRecord: RunView.record, Backend.run_record
    "xl.launcher.rundir.store",  # RunInfo (Backend.runs)
    "xl.launcher.plan",  # Plan: what Backend.plan shows the Launch screen, and Backend.start runs
    "xl.launcher.spec",  # LaunchSpec: what the Launch screen asks Backend.start for
    "xl.launcher.stacks.model",  # StacksDoc: what Backend.stacks hands the stacks screen
}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(source: str) -> list[tuple[int, str, bool]]:
    """(line, module, for types only) of every import of ``source``, at any depth."""
    out: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, types_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, types_only)
                continue
            visit_stmt(child, types_only)

    def visit_stmt(node: ast.AST, types_only: bool) -> None:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            out.append((node.lineno, _module_of(node.module, names), types_only))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, types_only) for a in node.names)
        visit(node, types_only)

    visit(ast.parse(source), False)
    return out


def _module_of(module: str, names: list[str]) -> str:
    """``from xl.launcher.rundir import timing`` imports the module xl.launcher.view.timing."""
    for name in names:
        if (ROOT / _path_of(name)).with_suffix(".py").exists():
            return name
    return module


def _path_of(module: str) -> Path:
    parts = module.split(".")[1:]  # xl.launcher.rundir.x -> launcher/rundir/x (package-dir)
    if parts and parts[0] not in ("launcher", "doctor", "tui", "examples"):
        parts = ["xl", *parts]
    return Path(*parts) if parts else Path("xl")


def breaches(source: str) -> list[str]:
    """What ``source`` (a screen or widget) imports from the domain against the rule."""
    found = []
    for line, module, types_only in _imports(source):
        if not module.startswith(DOMAIN) or module.split(".")[:2] == ["xl", "tui"]:
            continue
        allowed = TYPES if types_only else VIEWS
        if module not in allowed:
            found.append(f"line {line}: {module}{' (types)' if types_only else ''}")
    return found


def test_the_rule_names_what_breaks_it_and_leaves_the_views_alone() -> None:
    good = (
        "from typing import TYPE_CHECKING\n"
        "from xl.launcher.view.runview import node_order\n"
        "from xl.tui.backend import Backend\n"
        "from xl import units\n"
        "if TYPE_CHECKING:\n"
        "    from xl.launcher.view.reader import RunReader\n"
        "    from xl.doctor.report import Report\n"
    )
    assert breaches(good) == []
    bad = (
        "from typing import TYPE_CHECKING\n"
        "from xl.launcher.view import timing\n"  # a domain module at run time
        "import xl.launcher.control\n"
        "if TYPE_CHECKING:\n"
        "    from xl.launcher.supervisor.loop import Supervisor\n"  # no typed record of the views
        "else:\n"
        "    from xl.doctor.run import run_checks\n"
        "def f():\n"
        "    from xl.launcher.view.reader import RunReader  # noqa: PLC0415 - a reader made "
        "here\n"
    )
    assert breaches(bad) == [
        "line 2: xl.launcher.view.timing",
        "line 3: xl.launcher.control",
        "line 5: xl.launcher.supervisor.loop (types)",
        "line 7: xl.doctor.run",
        "line 9: xl.launcher.view.reader",
    ]


def test_screens_and_widgets_reach_the_domain_only_through_typed_views() -> None:
    files = sorted(
        [*(ROOT / "tui" / "screens").rglob("*.py"), *(ROOT / "tui" / "widgets").rglob("*.py")]
    )
    assert len(files) > 10, files
    found = {
        str(path.relative_to(ROOT)): hits
        for path in files
        if (hits := breaches(path.read_text(encoding="utf-8")))
    }
    assert not found, found


def test_every_module_the_rule_allows_exists() -> None:
    for module in TYPES:
        assert (ROOT / _path_of(module)).with_suffix(".py").exists(), module


def reaches_out(source: str) -> list[str]:
    """Where a widget of ``source`` queries widgets that are not its own: ``self.screen.query*``
    or ``self.app.query*`` (a widget draws its own children and tells its screen by message)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("query", "query_one", "query_exactly_one")
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in ("screen", "app", "parent")
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            found.append((node.lineno, f"line {node.lineno}: self.{node.value.attr}.{node.attr}"))
    return [text for _, text in sorted(found)]


def test_reaching_out_is_named_and_own_children_are_left_alone() -> None:
    own = "class W:\n    def f(self):\n        self.query_one(T).display = False\n"
    assert reaches_out(own) == []
    out = (
        "class W:\n"
        "    def f(self):\n"
        "        self.screen.query_one(T).display = False\n"
        "        self.app.query('#x')\n"
    )
    assert reaches_out(out) == ["line 3: self.screen.query_one", "line 4: self.app.query"]


def test_widgets_own_what_they_draw() -> None:
    """A widget never queries its screen's widgets, and no attribute of another object is reached
    past the type checker (``type: ignore[attr-defined]``)."""
    widgets = [*(ROOT / "tui" / "widgets").rglob("*.py"), ROOT / "tui/screens/monitor_nodes.py"]
    found = {
        str(path.relative_to(ROOT)): hits
        for path in widgets
        if (hits := reaches_out(path.read_text(encoding="utf-8")))
    }
    assert not found, found
    ignored = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in (ROOT / "tui").rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "type: ignore[attr-defined]" in line
    ]
    assert not ignored, ignored
