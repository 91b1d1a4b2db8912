"""The property and fuzz tests run a fixed number of examples in CI: every budget in tests/properties.py is
used by exactly one test, and every property test takes its budget from there (none runs hypothesis's
default, or a count of its own)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.properties import EXAMPLES

ROOT = Path(__file__).resolve().parents[3]


def test_every_example_budget_is_used_once_and_every_property_test_has_one():
    used: dict[str, int] = {}
    for file in sorted((ROOT / "tests").rglob("test_*.py")):
        if file.resolve() == Path(__file__).resolve():
            continue
        text = file.read_text()
        for name in re.findall(r'@examples\("(\w+)"', text):
            used[name] = used.get(name, 0) + 1
        given = len(re.findall(r"^@given\(", text, re.M))
        budgeted = len(re.findall(r'^@examples\("', text, re.M))
        assert given == budgeted, f"{file.name}: {given} @given tests, {budgeted} with an @examples budget"
        assert "max_examples" not in text, f"{file.name} sets max_examples itself; add it to EXAMPLES"
    assert used == dict.fromkeys(EXAMPLES, 1), used
    assert sum(EXAMPLES.values()) < 5000  # the CI cost stays modest
