"""run.json's documentation is derived from its type: every key of ``record.RunJson`` (the record),
``record.RankRow`` (a rank), ``record.DeviceRow`` (a GPU) and ``outcome.Failure`` (the root cause)
is named in docs/contracts.md's "run.json" section, so a key added to the code without a line for
people fails here."""

from __future__ import annotations

import re
from typing import get_type_hints

import pytest
from where import REPO

from xl.launcher.rundir.outcome import Failure
from xl.launcher.rundir.runrecord import DeviceRow, RankRow, RunJson


def _section(title: str) -> str:
    text = (REPO / "docs" / "contracts.md").read_text(encoding="utf-8")
    start = text.index(f"\n### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start : end if end != -1 else None]


def _named(section: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", section))


RUN_JSON = _section("run.json")


@pytest.mark.parametrize("key", sorted(get_type_hints(RunJson)))
def test_every_key_of_the_record_is_in_the_run_json_table(key: str) -> None:
    assert re.search(rf"^\| `{key}`|, `{key}` \|", RUN_JSON, re.M), (
        f"run.json's {key!r} has no row in docs/contracts.md"
    )


@pytest.mark.parametrize("key", sorted(RankRow.json_keys()))
def test_every_key_of_a_rank_is_documented(key: str) -> None:
    assert key in _named(RUN_JSON.split("\nA rank:", 1)[1].split("\n\n", 1)[0]), (
        f"a rank's {key!r} is not in docs/contracts.md"
    )


def test_every_key_of_a_device_is_documented() -> None:
    row = next(line for line in RUN_JSON.splitlines() if line.startswith("| `devices` |"))
    assert set(re.findall(r'"([a-z_]+)"', row)) == set(DeviceRow.json_keys())


@pytest.mark.parametrize("key", sorted(Failure.from_json({}).to_json()))
def test_every_key_of_the_failure_is_documented(key: str) -> None:
    assert key in _named(RUN_JSON.split("\n`failure`:", 1)[1].split("\n\n", 1)[0]), (
        f"failure's {key!r} is not in docs/contracts.md"
    )
