"""Where things are, for tests in any folder under tests/ (they no longer sit beside fixtures/)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SUPPORT = TESTS / "support"
FIXTURES = TESTS / "fixtures"
