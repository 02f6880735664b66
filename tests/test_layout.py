"""The house rules of the layout, checked on the source (docs/architecture.md, "What the layout
tests enforce"):

- no import cycle between xl's modules, counting imports inside functions (type-only imports under
  ``if TYPE_CHECKING:`` excepted: they never run);
- each layer imports only what the layer table (LAYERS) lets it: the lowest layer (``xl``)
  nothing of doctor/, launcher/ or tui/; the doctor neither the launcher nor the app; the
  launcher the doctor only through the doctor's API, ``xl.doctor.api`` (type-only imports count
  here: types come through the API too); and the training-side client reaches none of them,
  directly or through another module;
- no module over 500 lines, no class over 300;
- an import inside a function says why (``# noqa: PLC0415 - <reason>``);
- every package folder is in pyproject.toml's package list, mapped to its folder;
- no six lines of product code repeated in two places.

The graph is read from the source with ``ast``, so an import hidden in a function body counts.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> import name of the package it holds (pyproject.toml's package-dir)
FOLDERS = {"xl": "xl", "doctor": "xl.doctor", "launcher": "xl.launcher", "tui": "xl.tui"}
# The layer table (docs/architecture.md, "Layers"): each layer, and what its modules may import:
# a layer named here (any of its modules) or one module of another layer (that layer's API).
# A module belongs to the longest layer name its own name starts with.
LAYERS: dict[str, tuple[str, ...]] = {
    "xl": ("xl",),
    "xl.doctor": ("xl", "xl.doctor"),
    "xl.launcher": ("xl", "xl.launcher", "xl.doctor.api"),
    "xl.tui": ("xl", "xl.doctor", "xl.launcher", "xl.tui"),
}
# Modules that still cross the table, each with the way through the API it is to take. An entry
# that no longer crosses fails too, so this list only shrinks.
CROSSING: dict[str, str] = {}
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300
REASON = re.compile(r"#\s*noqa:\s*PLC0415\s*[-—:]\s*\S.{4,}")


@cache
def modules() -> dict[str, Path]:
    """Every product module by its import name."""
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            # xl/ holds the other packages' names too (xl.doctor is doctor/, not xl/doctor/).
            out.setdefault(name, path)
    return out


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _walk_runtime(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """(import statement, whether it sits in a function) for every import that can run."""
    for child in ast.iter_child_nodes(node):
        if _type_checking_only(child):
            for other in getattr(child, "orelse", []):
                yield from _walk_runtime(other, in_function)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        inner = in_function or isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        yield from _walk_runtime(child, inner)


def _targets(name: str, node: ast.AST) -> set[str]:
    """The xl modules an import statement in module ``name`` loads."""
    known = modules()
    is_package = known[name].name == "__init__.py"
    out: set[str] = set()
    if isinstance(node, ast.Import):
        bases = [alias.name for alias in node.names]
        for base in bases:
            while base and base not in known:
                base = base.rpartition(".")[0]
            if base:
                out.add(base)
        return out
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = name if is_package else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")
        elif base in known:
            out.add(base)
    return out


@cache
def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules().items():
        for node, _ in _walk_runtime(tree(path)):
            edges[name] |= _targets(name, node) - {name}
    return edges


def _cycles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _reachable(start: str) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in graph().get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_checker_sees_cycles_and_function_level_imports() -> None:
    """The cycle finder on a made-up graph, and the walker on an import hidden in a function."""
    made_up = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(made_up, list("abcd")) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}, ["a", "b"]) == []
    src = ast.parse("import os\nif TYPE_CHECKING:\n    import re\ndef f():\n    import json\n")
    seen = [(n.names[0].name, inside) for n, inside in _walk_runtime(src)]  # type: ignore[attr-defined]
    assert seen == [("os", False), ("json", True)]


def test_no_import_cycles() -> None:
    assert len(modules()) > 60
    cycles = _cycles(graph(), list(modules()))
    assert not cycles, (
        "import cycles (break them by moving code, not by hiding imports):\n"
        + "\n".join(" <-> ".join(c) for c in cycles)
    )


def layer_of(name: str) -> str:
    """The layer a module belongs to: the longest name in LAYERS that is it or holds it."""
    return max((k for k in LAYERS if name == k or name.startswith(k + ".")), key=len)


def _every_import(node: ast.AST) -> Iterator[ast.AST]:
    """Every import statement, those under ``if TYPE_CHECKING:`` included."""
    for child in ast.walk(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child


def crossings(imports: dict[str, list[tuple[int, str, set[str]]]]) -> list[str]:
    """One line per import the layer table forbids: where it is, what it says, what the
    importing layer may import instead. ``imports``: module -> (line, source text, targets)."""
    out = []
    for name, found in sorted(imports.items()):
        allowed = LAYERS[layer_of(name)]
        for line, text, targets in found:
            bad = sorted(t for t in targets if layer_of(t) not in allowed and t not in allowed)
            if bad:
                out.append(
                    f"{name}:{line}: `{text}` reaches {', '.join(bad)}; "
                    f"{layer_of(name)} may import only {', '.join(allowed)}"
                )
    return out


def _imports_by_module() -> dict[str, list[tuple[int, str, set[str]]]]:
    out: dict[str, list[tuple[int, str, set[str]]]] = {}
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        out[name] = [
            (node.lineno, lines[node.lineno - 1].strip(), _targets(name, node) - {name})
            for node in _every_import(tree(path))
        ]
    return out


def test_the_layer_checker_names_the_import_that_crosses() -> None:
    """The checker on made-up imports: a doctor module reaching the launcher or the app, and a
    launcher module reaching past the doctor's API, are named with their line; the API itself,
    the lowest layer and the app's reach everywhere pass."""
    made_up = {
        "xl.doctor.checks.gpu": [
            (3, "from xl.launcher.plan import Plan", {"xl.launcher.plan"}),
            (4, "from xl.gpu import health", {"xl.gpu"}),
        ],
        "xl.doctor.render": [(9, "import xl.tui.app", {"xl.tui.app"})],
        "xl.launcher.cli.preflight": [
            (30, "from xl.doctor import api", {"xl.doctor.api"}),
            (31, "from xl.doctor.facts import vtuple", {"xl.doctor.facts"}),
        ],
        "xl.tui.backend": [(5, "from xl.doctor.run import run_doctor", {"xl.doctor.run"})],
        "xl.paths": [(2, "from xl.tui import app", {"xl.tui.app"})],
    }
    assert layer_of("xl.tuition") == "xl" and layer_of("xl.doctor") == "xl.doctor"
    assert crossings(made_up) == [
        "xl.doctor.checks.gpu:3: `from xl.launcher.plan import Plan` reaches xl.launcher.plan; "
        "xl.doctor may import only xl, xl.doctor",
        "xl.doctor.render:9: `import xl.tui.app` reaches xl.tui.app; "
        "xl.doctor may import only xl, xl.doctor",
        "xl.launcher.cli.preflight:31: `from xl.doctor.facts import vtuple` reaches "
        "xl.doctor.facts; xl.launcher may import only xl, xl.launcher, xl.doctor.api",
        "xl.paths:2: `from xl.tui import app` reaches xl.tui.app; xl may import only xl",
    ]


def test_each_layer_imports_only_what_the_layer_table_allows() -> None:
    imports = _imports_by_module()
    assert "xl.doctor.api" in imports, "the doctor's API, xl.doctor.api, is gone"
    found = crossings(imports)
    crossing = {line.partition(":")[0] for line in found}
    gone = sorted(set(CROSSING) - crossing)
    assert not gone, f"these no longer cross the layer table: remove them from CROSSING: {gone}"
    new = [line for line in found if line.partition(":")[0] not in CROSSING]
    assert not new, "imports the layer table forbids (tests/test_layout.py, LAYERS):\n" + "\n".join(
        new
    )


def test_the_training_client_reaches_no_doctor_launcher_or_tui() -> None:
    clients = [m for m in modules() if m == "xl.client" or m.startswith("xl.client.")]
    assert clients, "no xl.client module found"
    for client in clients:
        reached = _reachable(client)
        assert not [m for m in reached if m.startswith(("xl.doctor", "xl.launcher", "xl.tui"))], (
            client,
            sorted(reached),
        )


def test_modules_and_classes_stay_small() -> None:
    too_long = []
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_long.append(f"{name}.{node.name}: class of {size} lines")
    assert not too_long, too_long


def test_an_import_inside_a_function_says_why() -> None:
    silent = []
    for path in modules().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, in_function in _walk_runtime(tree(path)):
            if not in_function:
                continue
            span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
            if not any(REASON.search(line) for line in span):
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}: {span[0].strip()}")
    assert not silent, (
        "say why with '# noqa: PLC0415 - <reason>', or import at module level:\n"
        + "\n".join(silent)
    )


def test_every_package_is_installed_from_its_folder() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is in the standard library from Python 3.11")
    import tomllib  # noqa: PLC0415 - only from Python 3.11 (skipped above on older ones)

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    dirs, listed = config["package-dir"], set(config["packages"])
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([package, *rel.parts])
            if folder == "xl" and rel.parts and f"xl.{rel.parts[0]}" in FOLDERS.values():
                continue
            assert name in listed, f"{name} ({init.parent.relative_to(ROOT)}) missing from packages"
            assert dirs.get(name) == str(init.parent.relative_to(ROOT)), name


def _shape(line: str) -> str:
    return line.strip()


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are code: no blanks, comments, docstrings,
    imports, decorators or lone brackets (they repeat without being logic)."""
    skip: set[int] = set()
    for node in ast.walk(tree(path)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = _shape(line)
        if number in skip or not text or text.startswith(("#", "@")) or len(text) < 4:
            continue
        out.append((number, text))
    return out


def test_no_repeated_logic_in_product_code() -> None:
    """Six code lines in a row that stand somewhere else too are one helper written twice."""
    window = 6
    seen: dict[tuple[str, ...], str] = {}
    repeats = []
    for _, path in sorted(modules().items()):
        code = _code_lines(path)
        last_hit = -window
        for i in range(len(code) - window + 1):
            key = tuple(text for _, text in code[i : i + window])
            where = f"{path.relative_to(ROOT)}:{code[i][0]}"
            if key in seen and i - last_hit >= window:
                repeats.append(f"{where} repeats {seen[key]}")
                last_hit = i
            seen.setdefault(key, where)
    assert not repeats, "\n".join(repeats)
