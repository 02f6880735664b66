"""A check's status is one value (xl.doctor.status.Status): the JSON keeps the contract's words
(docs/contracts.md, `xl doctor --json`), the report's status is the worst of its checks in one
order, and every renderer draws a status from the same place."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from xl.doctor.checks.finding import Finding
from xl.doctor.render import render_plain, render_report, summary_line
from xl.doctor.report import Check, Report
from xl.doctor.status import Status, worst

WORDS = ("ok", "skip", "warn", "error", "fail")  # the contract's words, mildest first


def _check(status: Status | str, n: int = 0) -> Check:
    return Check(id=f"c{n}", status=status, title=f"check {n}", detail="d", fix="do x", area="A")


def test_the_json_says_the_contracts_words() -> None:
    assert [s.value for s in Status] == list(WORDS)
    report = Report(checks=[_check(w, i) for i, w in enumerate(WORDS)])
    text = json.dumps(report.to_json())
    back = json.loads(text)
    assert [c["status"] for c in back["checks"]] == list(WORDS) and back["status"] == "fail"
    # Plain str in the JSON tree, so no encoder ever writes "Status.FAIL".
    assert type(report.to_json()["status"]) is str and "Status." not in text
    assert f"{Status.WARN}" == str(Status.WARN) == "warn"


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ((), "ok"),
        (("ok", "skip"), "skip"),
        (("skip", "warn", "ok"), "warn"),
        (("warn", "error"), "error"),
        (("fail", "error", "warn"), "fail"),
    ],
)
def test_the_worst_status_wins_and_error_ranks_below_fail(
    statuses: tuple[str, ...], expected: str
) -> None:
    assert worst(statuses) is Status(expected)
    report = Report(checks=[_check(s, i) for i, s in enumerate(statuses)])
    assert report.status is Status(expected)


def test_strict_fails_on_warn_and_error_but_never_on_skip() -> None:
    for word, plain, strict in [
        ("ok", 0, 0),
        ("skip", 0, 0),
        ("warn", 0, 1),
        ("error", 0, 1),
        ("fail", 1, 1),
    ]:
        report = Report(checks=[_check("ok", 0), _check(word, 1)])
        assert (report.exit_code(), report.exit_code(strict=True)) == (plain, strict), word


def test_a_status_given_as_its_word_is_the_same_value() -> None:
    assert Finding("warn", "d").status is Status.WARN
    assert _check("fail").status is Status.FAIL
    assert render_plain(Report([_check("warn")])) == render_plain(Report([_check(Status.WARN)]))


def test_an_unknown_status_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown check status 'fine'"):
        _check("fine")
    with pytest.raises(ValueError):
        Finding("fine", "d")


def test_the_plain_report_labels_each_status_and_says_the_verdict() -> None:
    report = Report(checks=[_check(w, i) for i, w in enumerate(WORDS)])
    lines = render_plain(report).splitlines()
    labels = [line.split()[0] for line in lines[1:] if line.startswith("  ") and "check" in line]
    assert labels == ["ok", "skip", "WARN", "ERROR", "FAIL"]
    # A fix is printed under every status but ok.
    assert sum(line.strip() == "fix: do x" for line in lines) == 4
    assert summary_line(report).endswith("problems found (exit 1)")
    verdicts = {
        "ok": "ready",
        "skip": "ready",
        "warn": "usable, with warnings",
        "error": "some checks could not run",
    }
    for word, verdict in verdicts.items():
        line = summary_line(Report(checks=[_check(word)]))
        assert line == f"1 checks: 1 {word} — {verdict} (exit 0)", line


def test_the_terminal_report_draws_each_status_in_its_colour() -> None:
    report = Report(checks=[_check(w, i) for i, w in enumerate(WORDS)])
    buf = io.StringIO()
    Console(file=buf, width=100, force_terminal=True, color_system="standard").print(
        render_report(report)
    )
    out = buf.getvalue()
    # green, dim, yellow, magenta, bold red: each glyph in its status's colour.
    for code, glyph in [
        ("32", "✔"),
        ("2", "–"),
        ("33", "▲"),
        ("35", "?"),
        ("1;31", "✘"),
    ]:
        assert f"\x1b[{code}m{glyph}" in out, (glyph, out)
