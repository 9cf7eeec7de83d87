"""Heartbeat gaps counted in buckets: storage that stays small, exact where a timeout is judged.

A gap is counted in the bucket of the smallest edge at or above it (Prometheus' ``le``). The edges are a
geometric grid 2 % apart from 0.1 s to a week, joined by every whole second up to an hour and every whole
minute up to 12 hours (so every value a suggestion rounds to, ``quantiles.readable_round_up``, is one), then a
last bucket without bound. So:

- "gaps longer than T" is exact for every whole-second T up to an hour: a candidate timeout's mistake rate is
  the one computed on the gaps themselves;
- an order statistic read as its bucket's upper edge (capped by the longest gap, kept exactly) is never below
  the exact one, and about 2 % above it at most (3 % below a quarter of a second, 1 s between a minute and an
  hour): an upper bound stays an upper bound.

A day of one job type on one worker size fills a few dozen of the ~5,000 buckets: only those are stored. Plain
Python: the watcher that feeds it loads no numpy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_WEEK_MS = 7 * 86_400_000
_GEOMETRIC_RATIO = 1.02


def _edges_ms() -> tuple[int, ...]:
    geometric = set()
    edge = 100.0
    while edge < _WEEK_MS:
        geometric.add(round(edge))
        edge *= _GEOMETRIC_RATIO
    whole_seconds = range(1_000, 3_600_001, 1_000)
    whole_minutes = range(3_600_000, 43_200_001, 60_000)
    return tuple(sorted(geometric | set(whole_seconds) | set(whole_minutes) | {_WEEK_MS}))


#: The buckets' upper edges, in whole milliseconds; past the last one, :data:`OVERFLOW`.
EDGES_MS = _edges_ms()
#: The key of the last bucket, without bound (a gap of over a week: never a live job's, in practice).
OVERFLOW = -1
#: How a bucket's key is written in a document (an edge in milliseconds as text, or this for :data:`OVERFLOW`).
OVERFLOW_TEXT = "inf"


def bucket_of(seconds: float) -> int:
    """The key of the bucket holding a gap of ``seconds``: its upper edge in milliseconds, or :data:`OVERFLOW`."""
    return _bucket_of_ms(seconds * 1000.0)


def _bucket_of_ms(milliseconds: float) -> int:
    index = bisect.bisect_left(EDGES_MS, milliseconds)
    return EDGES_MS[index] if index < len(EDGES_MS) else OVERFLOW


def upper_edge_seconds(key: int) -> float:
    return math.inf if key == OVERFLOW else key / 1000.0


def _order(key: int) -> int:
    return EDGES_MS[-1] + 1 if key == OVERFLOW else key


@dataclass
class GapHistogram:
    """Gaps (or a job's longest silence) in :data:`EDGES_MS` buckets, with their exact sum and maximum."""

    counts: dict[int, int] = field(default_factory=dict)  # bucket key -> gaps
    total_seconds: float = 0.0
    longest: float = 0.0  # the longest gap itself

    @classmethod
    def of(cls, seconds: Iterable[float]) -> GapHistogram:
        histogram = cls()
        for value in seconds:
            histogram.add(value)
        return histogram

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def add(self, seconds: float) -> None:
        key = bucket_of(seconds)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.total_seconds += seconds
        self.longest = max(self.longest, seconds)

    def __add__(self, other: GapHistogram) -> GapHistogram:
        counts = dict(self.counts)
        for key, count in other.counts.items():
            counts[key] = counts.get(key, 0) + count
        return GapHistogram(counts, self.total_seconds + other.total_seconds, max(self.longest, other.longest))

    def sorted_buckets(self) -> list[tuple[int, int]]:
        """(key, count) of the buckets holding gaps, shortest first."""
        return sorted(((key, count) for key, count in self.counts.items() if count), key=lambda item: _order(item[0]))

    def longer_than(self, seconds: float) -> int:
        """Gaps longer than ``seconds``: exact when ``seconds`` is an edge (every whole second up to an hour), else
        the gaps of the bucket holding it counted too (never fewer than there are)."""
        return sum(count for key, count in self.counts.items() if upper_edge_seconds(key) > seconds)

    def at_or_below(self, bounds: Iterable[float]) -> tuple[int, ...]:
        """Gaps at or below each of ``bounds`` (edges, as Prometheus' cumulative buckets count them)."""
        return tuple(self.count - self.longer_than(bound) for bound in bounds)

    def order_statistic(self, rank: int) -> float:
        """An upper bound of the ``rank``-th shortest gap (from 1): its bucket's upper edge, at most the longest gap."""
        if not 1 <= rank <= self.count:
            raise ValueError(f"rank {rank} of {self.count} gaps")
        seen = 0
        for key, count in self.sorted_buckets():
            seen += count
            if seen >= rank:
                return min(upper_edge_seconds(key), self.longest)
        raise AssertionError("unreachable: the ranks add up to the count")

    def quantile(self, quantile: float) -> float | None:
        """The ``quantile`` read as an order statistic (the ``ceil(q n)``-th shortest), within its bucket; None: no gap."""
        count = self.count
        if not count:
            return None
        return self.order_statistic(min(max(math.ceil(quantile * count - 1e-9), 1), count))

    def as_document(self) -> dict[str, int]:
        """The buckets as a document's subdocument: each key its edge in milliseconds, as text."""
        return {_key_text(key): count for key, count in self.counts.items() if count}


def _key_text(key: int) -> str:
    return OVERFLOW_TEXT if key == OVERFLOW else str(key)


def bucket_field(parent: str, key: int) -> str:
    """The dotted path of one bucket in a document (``gaps.60000``), for ``$inc``."""
    return f"{parent}.{_key_text(key)}"


class MalformedHistogram(ValueError):
    """A stored histogram that cannot be read: a count that is not a whole number, a key that is not an edge."""


def histogram_of(buckets: Any, total_seconds: Any = 0.0, longest: Any = 0.0) -> GapHistogram:
    """The histogram a document holds; a key off the current grid goes to the bucket of the edge at or above it (still
    an upper edge). :class:`MalformedHistogram` for what cannot be read."""
    if buckets is None:
        buckets = {}
    if not isinstance(buckets, Mapping):
        raise MalformedHistogram(f"buckets are a {type(buckets).__name__}, not a document")
    counts: dict[int, int] = {}
    for text, count in buckets.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MalformedHistogram(f"bucket {text!r} holds {count!r}, not a count")
        if text == OVERFLOW_TEXT:
            key = OVERFLOW
        elif isinstance(text, str) and text.isdigit():
            key = _bucket_of_ms(int(text))
        else:
            raise MalformedHistogram(f"bucket {text!r} is not an edge in milliseconds")
        counts[key] = counts.get(key, 0) + count
    numbers = [value for value in (total_seconds, longest) if value is not None]
    if any(isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 for value in numbers):
        raise MalformedHistogram(f"sum {total_seconds!r} or longest {longest!r} is not a number of seconds")
    return GapHistogram(counts, float(total_seconds or 0.0), float(longest or 0.0))
