"""Figures over the seeds, each with its bootstrap interval: a target holds only when its interval does.

The resampling is hierarchical, as the data are: the seeds drawn with replacement, then, within each drawn seed,
its deaths drawn with replacement (:class:`Resamples`, one set of draws shared by every contender of the same deaths,
so two contenders are compared on the same resampled deaths: a paired interval for their difference). A rate per
10,000 runs resamples the seeds, then each seed's count as a binomial of its runs. Intervals are the 2.5 and 97.5
percentiles of ``B`` resamples (percentile bootstrap).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.replay.figures import ACTORS, CAUSES, DEATHS, FLEET_BINS, MISTAKES, PER_RUNS, SeedRecord
from benchmarks.replay.trace import Actor

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    n: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"value": _finite(self.value), "low": _finite(self.low), "high": _finite(self.high), "n": self.n}

    def text(self, digits: int = 0) -> str:
        def f(x: float) -> str:
            return "∞" if math.isinf(x) else f"{x:,.{digits}f}"

        return f"{f(self.value)} [{f(self.low)}-{f(self.high)}]"


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(x, 3)


class Resamples:
    """``B`` hierarchical draws of the deaths of a set of seeds (each draw: an index array into the pooled deaths)."""

    def __init__(self, records: Sequence[SeedRecord], draws: int = 400, seed: int = 35) -> None:
        rng = np.random.default_rng(seed)
        sizes = [len(record.detection) for record in records]
        offsets = np.cumsum([0, *sizes])
        self.seeds = len(records)
        self.draws: list[np.ndarray] = []
        self.seed_draws: list[np.ndarray] = []
        for _ in range(draws):
            chosen = rng.integers(0, len(records), len(records))
            self.seed_draws.append(chosen)
            parts = [offsets[s] + rng.integers(0, sizes[s], sizes[s]) for s in chosen if sizes[s]]
            self.draws.append(np.concatenate(parts) if parts else np.zeros(0, dtype=int))


def pooled(records: Sequence[SeedRecord], name: str) -> np.ndarray:
    return np.concatenate([getattr(record, name) for record in records]) if records else np.zeros(0)


def quantile(
    records: Sequence[SeedRecord], resamples: Resamples, q: float, mask: Callable[[SeedRecord], np.ndarray]
) -> Estimate:
    """The ``q``-quantile (0-100) of the detection times the mask keeps, pooled over the seeds, with its interval."""
    values = pooled(records, "detection")
    keep = np.concatenate([mask(record) for record in records]) if records else np.zeros(0, dtype=bool)
    if not keep.any():
        return Estimate(math.nan, math.nan, math.nan, 0)
    point = float(np.percentile(values[keep], q))
    boots = []
    for draw in resamples.draws:
        chosen = values[draw][keep[draw]]
        if len(chosen):
            boots.append(float(np.percentile(chosen, q)))
    low, high = np.percentile(boots, [50 * (1 - CONFIDENCE), 100 - 50 * (1 - CONFIDENCE)])
    return Estimate(point, float(low), float(high), int(keep.sum()))


def difference(
    left: Sequence[SeedRecord],
    right: Sequence[SeedRecord],
    resamples: Resamples,
    q: float,
    mask: Callable[[SeedRecord], np.ndarray],
) -> Estimate:
    """q-quantile of ``left`` minus that of ``right`` on the same deaths (the same trace and kill_long_job), paired."""
    lv, rv = pooled(left, "detection"), pooled(right, "detection")
    keep = np.concatenate([mask(record) for record in left])
    if not keep.any():
        return Estimate(math.nan, math.nan, math.nan, 0)
    point = float(np.percentile(lv[keep], q) - np.percentile(rv[keep], q))
    boots = []
    for draw in resamples.draws:
        k = keep[draw]
        if k.any():
            boots.append(float(np.percentile(lv[draw][k], q) - np.percentile(rv[draw][k], q)))
    finite = [b for b in boots if not math.isnan(b)]
    low, high = np.percentile(finite, [2.5, 97.5]) if finite else (math.nan, math.nan)
    return Estimate(point, float(low), float(high), int(keep.sum()))


def share(
    records: Sequence[SeedRecord], resamples: Resamples, actors: set[Actor], deaths_only: bool = True
) -> Estimate:
    """The share of the deaths whose first finalization was by one of ``actors``."""
    actor = pooled(records, "actor")
    keep = (
        np.isin(pooled(records, "cause"), [CAUSES.index(c) for c in DEATHS])
        if deaths_only
        else np.ones(len(actor), bool)
    )
    hit = np.isin(actor, [ACTORS.index(a) for a in actors])
    if not keep.any():
        return Estimate(math.nan, math.nan, math.nan, 0)
    boots = [float(hit[d][keep[d]].mean()) for d in resamples.draws if keep[d].any()]
    low, high = np.percentile(boots, [2.5, 97.5])
    return Estimate(float(hit[keep].mean()), float(low), float(high), int(keep.sum()))


def rate(records: Sequence[SeedRecord], resamples: Resamples, name: str, seed: int = 7) -> Estimate:
    """A mistake per 10,000 runs: seeds resampled, each seed's count a binomial of its runs."""
    rng = np.random.default_rng(seed)
    counts = np.asarray([record.mistakes.get(name, 0) for record in records], dtype=float)
    runs = np.asarray([record.runs for record in records], dtype=float)
    if not runs.sum():
        return Estimate(math.nan, math.nan, math.nan, 0)
    point = counts.sum() / runs.sum() * PER_RUNS
    boots = []
    for chosen in resamples.seed_draws:
        drawn = rng.binomial(runs[chosen].astype(int), np.minimum(counts[chosen] / np.maximum(runs[chosen], 1), 1))
        boots.append(drawn.sum() / runs[chosen].sum() * PER_RUNS)
    low, high = np.percentile(boots, [2.5, 97.5])
    return Estimate(float(point), float(low), float(high), int(counts.sum()))


def cause_mask(cause: int | None) -> Callable[[SeedRecord], np.ndarray]:
    """Deaths of one cause (an index into CAUSES); None: every death (crash, SIGTERM, never started)."""
    if cause is None:
        deaths = [CAUSES.index(c) for c in DEATHS]
        return lambda record: np.isin(record.cause, deaths)
    return lambda record: record.cause == cause


def bin_mask(position: int) -> Callable[[SeedRecord], np.ndarray]:
    deaths = [CAUSES.index(c) for c in DEATHS]
    return lambda record: (record.bin == position) & np.isin(record.cause, deaths)


def summary(records: Sequence[SeedRecord], resamples: Resamples) -> dict[str, Any]:
    """Every figure of one contender over the seeds: p50/p99 per cause and per fleet bin, mistakes per 10,000."""
    out: dict[str, Any] = {"by_cause": {}, "by_fleet": {}, "mistakes_per_10k": {}}
    for position, cause in [(None, None), *enumerate(CAUSES)]:
        name = "deaths" if cause is None else cause.value
        mask = cause_mask(position)
        out["by_cause"][name] = {
            "p50": quantile(records, resamples, 50, mask).as_dict(),
            "p99": quantile(records, resamples, 99, mask).as_dict(),
            "unfinalized": int(sum(np.isinf(r.detection[mask(r)]).sum() for r in records)),
        }
    for position, (name, _, _) in enumerate(FLEET_BINS):
        mask = bin_mask(position)
        out["by_fleet"][name] = {
            "p50": quantile(records, resamples, 50, mask).as_dict(),
            "p99": quantile(records, resamples, 99, mask).as_dict(),
        }
    for name in MISTAKES:
        out["mistakes_per_10k"][name] = rate(records, resamples, name).as_dict()
    actors = pooled(records, "actor")
    causes = pooled(records, "cause")
    deaths = np.isin(causes, [CAUSES.index(c) for c in DEATHS])
    out["first_finalized_by"] = {
        actor.value: int(((actors == position) & deaths).sum()) for position, actor in enumerate(ACTORS)
    }
    out["runs"] = int(sum(r.runs for r in records))
    out["hung_worker_hours"] = round(sum(r.hung_worker_hours for r in records), 1)
    out["overdue_finalized"] = int(sum(r.overdue_finalized for r in records))
    out["seeds"] = len(records)
    out["wall_seconds"] = round(sum(r.wall_seconds for r in records), 1)
    totals: dict[str, int] = {}
    for record in records:
        for key, value in record.counts.items():
            totals[key] = totals.get(key, 0) + int(value)
    out["counts"] = totals
    return out
