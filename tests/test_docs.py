"""What the documentation says is what the code does: defaults, settings, and the one choice every page states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zombie_pipeline.config import MONGO_TIMEOUT_ENV
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.connections import DEFAULT_TIMEOUT_MS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: Defaults the policy table states in words: what the field's default means, not a value.
IN_WORDS = {"per generation": None, "detected": None}


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``, as lists of cells."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def value_of(cell: str) -> object:
    """A default as the README writes it: a number, true/false, `{}`, or words."""
    cell = cell.strip("`")
    if cell in IN_WORDS:
        return IN_WORDS[cell]
    if cell in ("true", "false"):
        return cell == "true"
    if cell == "{}":
        return {}
    return float(cell) if "." in cell else int(cell)


def policy_table() -> dict[str, object]:
    """field -> default, from the README's policy table (a row may name several fields: `a` / `b` | 1 / 2)."""
    defaults = {}
    for name_cell, default_cell, *_ in table_rows(README, "| field | default |"):
        names = re.findall(r"`([a-z_]+)`", name_cell)
        values = [value_of(part.strip()) for part in default_cell.split(" / ")]
        assert len(names) == len(values), name_cell
        defaults.update(zip(names, values))
    return defaults


def test_the_readme_policy_table_names_every_field_of_the_policy():
    assert set(policy_table()) == set(ZombiePolicy.model_fields)


@pytest.mark.parametrize("field", sorted(ZombiePolicy.model_fields))
def test_the_readme_policy_table_states_each_default_the_policy_has(field: str):
    stated = policy_table()[field]
    actual = ZombiePolicy.model_fields[field].get_default(call_default_factory=True)
    assert stated == actual, f"README says {field} defaults to {stated!r}, policy.ZombiePolicy to {actual!r}"


def test_every_page_says_transactions_are_off_by_default_as_the_policy():
    assert ZombiePolicy().transactions is False
    assert policy_table()["transactions"] is False
    assert "By default (`transactions: false`)" in (ROOT / "docs" / "generations.md").read_text()
    assert "### The `transactions` default: off" in (ROOT / "docs" / "reliability.md").read_text()
    assert "Off (the default)" in ZombiePolicy.model_fields["transactions"].description


def test_the_readme_documents_the_database_timeout_with_its_default():
    [row] = [row for row in table_rows(README, "| variable | default |") if row[0] == f"`{MONGO_TIMEOUT_ENV}`"]
    assert value_of(row[1]) == DEFAULT_TIMEOUT_MS
