"""The README a newcomer reads first: short (the detail is in docs/), its two commands at the top
exactly as a fresh clone runs them, and every link it (and the pages that took its detail) holds
leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 200

# The two commands (docs/architecture.md names the second as what CI runs: .ci/run).
MAIN_JOB = "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . && .venv/bin/xl demo"
TESTS = (
    "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus "
    "chromium-headless-shell tmux slurm-client slurmd slurmctld iproute2 && python3 -m venv .venv "
    "&& .venv/bin/pip install torch==2.13.0 -e '.[dev]' && .venv/bin/ruff check . && "
    ".venv/bin/python tests/support/typecheck.py && .venv/bin/pytest -n 2 --dist loadfile"
)

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _pages() -> list[Path]:
    """The README and the pages that took its detail."""
    return [README, ROOT / "docs" / "app.md", ROOT / "docs" / "output.md"]


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    blocks = re.findall(r"```sh\n(.*?)\n```", README.read_text(), flags=re.S)
    assert blocks[:2] == [MAIN_JOB, TESTS], blocks[:2]
    first_section = README.read_text().split("\n## ", 2)[1]
    assert first_section.startswith("Two commands")


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.name)
def test_every_link_leads_somewhere(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        missing = anchor and goal.suffix == ".md" and anchor not in _anchors(goal)
        if not goal.exists() or missing:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"
