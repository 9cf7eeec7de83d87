"""How the sentences people read say a number of things: "1 zombie", "2 zombies", "0 retries"."""

from __future__ import annotations

import math

#: Nouns whose plural is not the noun and an ``s``.
_PLURALS = {
    "retry": "retries",
    "was": "were",
    "is": "are",
    "has": "have",
    "its": "their",
    "it": "them",
    "this": "these",
}


def plural(count: int | float, noun: str, many: str | None = None) -> str:
    """``noun`` as ``count`` of them are said: the noun itself for one, else ``many`` (default: the noun's plural)."""
    if count == 1:
        return noun
    if many is not None:
        return many
    last = noun.rsplit(" ", 1)[-1]
    head = noun[: len(noun) - len(last)]
    if last in _PLURALS:
        return head + _PLURALS[last]
    if last.endswith(("s", "x", "sh", "ch")):
        return noun + "es"
    if last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"


def counted(count: int | float, noun: str, many: str | None = None) -> str:
    """``1 zombie``, ``2 zombies``: a count and its noun, agreed."""
    return (
        f"{count:g} {plural(count, noun, many)}" if isinstance(count, float) else f"{count} {plural(count, noun, many)}"
    )


def shown(value: object) -> str:
    """A value as a person typed it: ``-3`` for the float -3.0 an option parsed, ``1.5``, ``'abc'``."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    return repr(value)
