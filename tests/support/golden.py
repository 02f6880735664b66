"""Golden files for the contract tests (tests/contracts/fixtures): what users and tools rely on,
recorded once from the code and compared on every run.

Re-record on purpose (a contract change, to be explained in the change's note) with
``XL_CONTRACTS_RECORD=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "contracts" / "fixtures"
RECORD = os.environ.get("XL_CONTRACTS_RECORD") == "1"


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def golden(name: str, actual: Any) -> None:
    """``actual`` must equal the whole of fixtures/<name>."""
    path = FIXTURES / name
    if RECORD:
        _dump(path, actual)
        return
    assert path.exists(), f"{path} is missing: record it with XL_CONTRACTS_RECORD=1"
    assert actual == json.loads(path.read_text()), (
        f"contract {name} changed (XL_CONTRACTS_RECORD=1 re-records it)"
    )


def golden_entry(name: str, key: str, actual: Any) -> None:
    """``actual`` must equal the entry ``key`` of fixtures/<name> (a JSON object of cases)."""
    path = FIXTURES / name
    data = json.loads(path.read_text()) if path.exists() else {}
    if RECORD:
        data[key] = actual
        _dump(path, data)
        return
    assert key in data, f"{path} has no {key!r}: record it with XL_CONTRACTS_RECORD=1"
    assert actual == data[key], (
        f"contract {name}[{key}] changed (XL_CONTRACTS_RECORD=1 re-records it)"
    )
