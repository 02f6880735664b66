"""The house's typing counts: how much of the product still passes loose JSON-shaped values.

    .venv/bin/python bench/house_counts.py [--list]

Prints, over the product (xl/, doctor/, launcher/, tui/): the public functions and methods (no
leading underscore, module level or in a class) whose signature mentions ``Any``, those whose
signature mentions ``dict[str, Any]``, and the classes and modules over the size limits that
tests/test_layout.py holds. Read from the source with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRODUCT = ("xl", "doctor", "launcher", "tui")
# What is left may only be at an edge: where JSON is read or written (files, the wire, node links).
GOAL_ANY = 60
GOAL_DICT = 30


def _signature_text(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    parts = [ast.unparse(a.annotation) for a in _all_args(node.args) if a.annotation]
    if node.returns is not None:
        parts.append(ast.unparse(node.returns))
    return " ".join(parts)


def _all_args(args: ast.arguments) -> list[ast.arg]:
    found = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    found += [a for a in (args.vararg, args.kwarg) if a is not None]
    return found


def _public_functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            found += [
                item
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
    return [f for f in found if not f.name.startswith("_")]


def _at_edge(lines: list[str], fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the line above the def (or its first decorator) says why the value is loose."""
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    above = lines[first - 2].strip() if first >= 2 else ""
    return above.startswith("#") and "edge:" in above


def main(argv: list[str] | None = None) -> int:
    show = "--list" in (sys.argv[1:] if argv is None else argv)
    any_sig: list[str] = []
    dict_any: list[str] = []
    unsaid: list[str] = []
    folders: dict[str, list[int]] = {}
    modules = 0
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules += 1
            source = path.read_text()
            lines = source.splitlines()
            tree = ast.parse(source, str(path))
            counts = folders.setdefault(str(path.parent.relative_to(ROOT)), [0, 0])
            for fn in _public_functions(tree):
                text = _signature_text(fn)
                where = f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"
                loose = bool(re.search(r"\bAny\b", text))
                if loose:
                    any_sig.append(where)
                    counts[0] += 1
                    if not _at_edge(lines, fn):
                        unsaid.append(where)
                if re.search(r"\b[dD]ict\[str, Any\]", text):
                    dict_any.append(where)
                    counts[1] += 1
    print(f"modules: {modules}")
    print(f"public functions with Any in their signature: {len(any_sig)} (goal {GOAL_ANY})")
    print(
        f"public functions with dict[str, Any] in their signature: {len(dict_any)}"
        f" (goal {GOAL_DICT})"
    )
    print(f"  with Any, not said to be at an edge ('# edge: why' above the def): {len(unsaid)}")
    for folder, (n_any, n_dict) in sorted(folders.items()):
        if n_any or n_dict:
            print(f"    {folder:32} {n_any:4} Any {n_dict:4} dict[str, Any]")
    if show:
        for where in any_sig:
            kind = "dict" if where in dict_any else "Any "
            print(f"  {kind} {'edge' if where not in unsaid else '    '} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
