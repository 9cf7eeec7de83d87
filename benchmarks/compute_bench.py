"""The statistics step's own work at 1M finished jobs, with the server left out.

On the embedded server, reading a million jobs takes minutes and is the
server's speed, not ours; the issue's compute target is about what follows the
read. So the documents the daily queries would return (the simulator's job
types and duration laws, only the fields of the statistics projection) are
encoded to BSON once, in batches of ``tallies.READ_BATCH_SIZE`` like cursor
replies, and each run decodes them batch by batch with the client's codec
options, as pymongo does. Decoding is timed apart (it is part of any read);
what is left is ours: ``tally_jobs`` per day, ``combine``, ``analyze``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from typing import Any, Callable, Iterator

import bson
from bson.codec_options import CodecOptions

from benchmarks.data import _finished_jobs, history_for
from benchmarks.harness import measure, median
from benchmarks.history_bench import Clock, days_of
from zombie_pipeline.documents import ID, Job
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.statistics import tallies
from zombie_pipeline.statistics.suggest import analyze

#: what ``zombie_pipeline.mongo.client_for`` decodes with
CODEC_OPTIONS = CodecOptions(tz_aware=True, tzinfo=dt.timezone.utc)
PROJECTED = (Job.TYPE, Job.STATUS, Job.STARTED_AT, Job.FINISHED_AT)


def encoded_days(size: int, now: dt.datetime, seed: int = 7) -> dict[tuple[dt.datetime, dt.datetime], list[bytes]]:
    """The window's jobs by UTC day, as BSON reply batches of the statistics projection."""
    history = history_for(now)
    days = days_of(history)
    by_day: dict[tuple[dt.datetime, dt.datetime], list[list[bytes]]] = {day: [[]] for day in days}
    for job in _finished_jobs(size, history, seed, ZombiePolicy().max_duration_seconds):
        day = days[(job[Job.FINISHED_AT] - history.first_day).days]
        batches = by_day[day]
        if len(batches[-1]) >= tallies.READ_BATCH_SIZE:
            batches.append([])
        batches[-1].append(bson.encode({name: job[name] for name in (ID, *PROJECTED) if name in job}))
    return {day: [b"".join(batch) for batch in batches if batch] for day, batches in by_day.items()}


def _decoded(batches: list[bytes], clock: Clock) -> Iterator[dict[str, Any]]:
    for batch in batches:
        started = time.perf_counter()
        documents = bson.decode_all(batch, CODEC_OPTIONS)
        clock.seconds += time.perf_counter() - started
        yield from documents


def statistics_step(days: dict[tuple[dt.datetime, dt.datetime], list[bytes]], policy: ZombiePolicy, clock: Clock) -> int:
    """The window as the assets compute it, fed from memory; returns the jobs read."""
    periods = [
        tallies.tally_jobs(tallies.Period(start=start, end=end), _decoded(batches, clock))
        for (start, end), batches in days.items()
    ]
    period = tallies.combine(periods)
    analyze(period, policy, undated=Counter())
    return period.jobs_read


def compute_case(size: int, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.perf_counter()
    days = encoded_days(size, dt.datetime.now(dt.timezone.utc))
    encoded_mb = sum(len(batch) for batches in days.values() for batch in batches) / 2**20
    log(f"  {size} jobs encoded in {time.perf_counter() - started:.1f} s ({encoded_mb:.0f} MB of BSON)")
    policy = ZombiePolicy()
    traced_clock = Clock()
    traced = measure(lambda: statistics_step(days, policy, traced_clock), trace_memory=True)
    decodes, computes = [], []
    for _ in range(max(1, repeats)):
        clock = Clock()
        run = measure(lambda: statistics_step(days, policy, clock))
        decodes.append(clock.seconds)
        computes.append(run.wall_seconds - clock.seconds)
    row = {
        "section": "compute",
        "finished_jobs": size,
        "jobs_read": traced.result,
        "runs": len(computes),
        "decode_median_seconds": round(median(decodes), 3),
        "compute_median_seconds": round(median(computes), 3),
        "compute_seconds": [round(c, 3) for c in computes],
        "peak_python_mb": round(traced.peak_python_mb, 1),
    }
    log(
        f"  statistics step without the server, {size} jobs: compute {row['compute_median_seconds']:.2f} s "
        f"(decoding {row['decode_median_seconds']:.2f} s apart), peak {row['peak_python_mb']:.0f} MB"
    )
    return row
