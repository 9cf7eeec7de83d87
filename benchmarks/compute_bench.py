"""The statistics step's own work at 1M finished jobs, with the server left out: both paths.

On the embedded server, reading a million jobs takes minutes and is the
server's speed, not ours; the issue's targets are about what the client does
with the replies. So the documents the daily queries would return (the
simulator's job types and duration laws, one query per UTC day and status, as
``jobs_source.read_period`` sends them) are encoded to BSON once, in batches of
``tallies.READ_BATCH_SIZE`` like cursor replies, and each path decodes them
batch by batch as its client would:

* **documents** (the path before issue 15): ``bson.decode_all`` with the
  client's codec options (``tz_aware``, UTC) into dicts, then
  ``tally_jobs`` per day;
* **arrow** (``read_period`` today): pymongoarrow's context with the explicit
  job schema decodes each batch straight into columns (what ``find_arrow_all``
  does with the cursor's raw batches), then the same rules on whole columns.

For each path, decoding is timed apart (it is part of any read) from what is
left (ours: tallies, ``combine``, ``analyze``); peak memory is traced over a
whole run, decoding included. Both paths must give the same tallies.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import bson
import pyarrow as pa
from bson.codec_options import CodecOptions
from pymongoarrow.context import PyMongoArrowContext

from benchmarks.data import _finished_jobs, history_for
from benchmarks.harness import measure, median, present, spread
from benchmarks.history_bench import Clock, days_of
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.statistics import jobs_source, tallies
from zombie_pipeline.statistics.analysis import analyze

#: what ``zombie_pipeline.queue.connections.client_for`` decodes with
CODEC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True, tzinfo=dt.UTC)
PROJECTED = (Job.TYPE, Job.STATUS, Job.STARTED_AT, Job.FINISHED_AT)


Day = tuple[dt.datetime, dt.datetime]
#: day -> status -> BSON reply batches (the projection of each path)
Encoded = dict[Day, dict[str, list[bytes]]]
PATHS = ("documents", "arrow")


def encoded_days(size: int, now: dt.datetime, seed: int = 7) -> tuple[Encoded, Encoded]:
    """The window's jobs by UTC day and status, as BSON reply batches: the documents path's projection
    (``_id``, type, status, dates) and the Arrow path's (the schema's fields: the status is the query's)."""
    history = history_for(now)
    days = days_of(history)
    documents: dict[Day, dict[str, list[list[bytes]]]] = {day: {} for day in days}
    arrow: dict[Day, dict[str, list[list[bytes]]]] = {day: {} for day in days}
    arrow_fields = tuple(jobs_source._JOB_SCHEMA.to_arrow().names)
    for job in _finished_jobs(size, history, seed, ZombiePolicy().max_duration_seconds):
        day = days[(job[Job.FINISHED_AT] - history.first_day).days]
        status = job[Job.STATUS]
        for out, fields in ((documents, (ID, *PROJECTED)), (arrow, arrow_fields)):
            batches = out[day].setdefault(status, [[]])
            if len(batches[-1]) >= tallies.READ_BATCH_SIZE:
                batches.append([])
            batches[-1].append(bson.encode({name: job[name] for name in fields if name in job}))

    def joined(out: dict[Day, dict[str, list[list[bytes]]]]) -> Encoded:
        return {
            day: {status: [b"".join(b) for b in batches if b] for status, batches in by_status.items()}
            for day, by_status in out.items()
        }

    return joined(documents), joined(arrow)


def _decoded(by_status: dict[str, list[bytes]], clock: Clock) -> Iterator[dict[str, Any]]:
    for batches in by_status.values():
        for batch in batches:
            started = time.perf_counter()
            documents = bson.decode_all(batch, CODEC_OPTIONS)
            clock.seconds += time.perf_counter() - started
            yield from documents


def statistics_documents(days: Encoded, policy: ZombiePolicy, clock: Clock) -> tallies.Period:
    """The window as the assets computed it before Arrow: dicts, ``tally_jobs`` per day."""
    periods = [
        jobs_source.tally_jobs(tallies.Period(start=start, end=end), _decoded(by_status, clock))
        for (start, end), by_status in days.items()
    ]
    period = tallies.combine(periods)
    analyze(period, policy, undated=Counter())
    return period


def _arrow_period(
    start: dt.datetime, end: dt.datetime, by_status: dict[str, list[bytes]], clock: Clock
) -> tallies.Period:
    """``jobs_source.read_period`` without the server (and without audit events: the simulator's history has none)."""
    period = tallies.Period(start=start, end=end)
    pieces = jobs_source._Pieces()
    found: set[Any] = set()
    for status, batches in by_status.items():
        started = time.perf_counter()
        context = PyMongoArrowContext(jobs_source._JOB_SCHEMA, codec_options=CODEC_OPTIONS)
        for batch in batches:
            context.process_bson_stream(batch)
        table = context.finish()
        clock.seconds += time.perf_counter() - started
        period.jobs_read += table.num_rows
        columns = jobs_source._table_columns(period, table, status, {}, found)
        if columns is not None:
            jobs_source._count(period, pieces, columns)
    return jobs_source._close(period, pieces, {}, found)


def statistics_arrow(days: Encoded, policy: ZombiePolicy, clock: Clock) -> tallies.Period:
    """The window as the assets compute it today: columns, one table per day and status."""
    period = tallies.combine([_arrow_period(start, end, by_status, clock) for (start, end), by_status in days.items()])
    analyze(period, policy, undated=Counter())
    return period


STEPS = {"documents": statistics_documents, "arrow": statistics_arrow}


def tallies_fingerprint(period: tallies.Period) -> dict[str, Any]:
    """What both paths must agree on: per type, the statuses and the sorted durations."""
    return {
        job_type: (
            dict(tally.statuses),
            tally.started,
            sorted(tally.success.tolist()),
            sorted(tally.error.tolist()),
        )
        for job_type, tally in sorted(period.tallies.items())
    } | {"bad_data": dict(period.bad_data), "jobs_read": period.jobs_read}


def compute_case(size: int, repeats: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per path: decode and compute medians with their spread, peak memory; runs interleaved."""
    started = time.perf_counter()
    encoded = dict(zip(PATHS, encoded_days(size, dt.datetime.now(dt.UTC))))
    sizes_mb = {
        path: sum(len(b) for by_status in days.values() for batches in by_status.values() for b in batches) / 2**20
        for path, days in encoded.items()
    }
    log(
        f"  {size} jobs encoded in {time.perf_counter() - started:.1f} s ({', '.join(f'{p} {mb:.0f} MB' for p, mb in sizes_mb.items())} of BSON)"
    )
    policy = ZombiePolicy()
    traced: dict[str, Any] = {}
    arrow_peaks: dict[str, float] = {}
    for path in PATHS:  # traced run first: peak memory (and a warm-up)
        clock = Clock()
        # tracemalloc sees Python's and numpy's allocations, not Arrow's (its own pool): a proxy of the pool
        # counts those, its peak reported beside
        default_pool = pa.default_memory_pool()
        pool = pa.proxy_memory_pool(default_pool)
        pa.set_memory_pool(pool)
        try:
            traced[path] = measure(lambda: STEPS[path](encoded[path], policy, clock), trace_memory=True)
        finally:
            pa.set_memory_pool(default_pool)
        arrow_peaks[path] = pool.max_memory() / 2**20
    same = tallies_fingerprint(traced["documents"].result) == tallies_fingerprint(traced["arrow"].result)
    decodes: dict[str, list[float]] = {path: [] for path in PATHS}
    computes: dict[str, list[float]] = {path: [] for path in PATHS}
    for repetition in range(max(1, repeats)):
        for path in PATHS if repetition % 2 == 0 else tuple(reversed(PATHS)):  # interleaved
            clock = Clock()
            run = measure(lambda: STEPS[path](encoded[path], policy, clock))
            decodes[path].append(clock.seconds)
            computes[path].append(run.wall_seconds - clock.seconds)
    rows = []
    for path in PATHS:
        totals = [d + c for d, c in zip(decodes[path], computes[path])]
        row = {
            "section": "compute",
            "path": path,
            "finished_jobs": size,
            "jobs_read": traced[path].result.jobs_read,
            "runs": len(computes[path]),
            "bson_mb": round(sizes_mb[path], 1),
            "decode_median_seconds": round(present(median(decodes[path])), 3),
            "compute_median_seconds": round(present(median(computes[path])), 3),
            "total_median_seconds": round(present(median(totals)), 3),
            "decode": spread(decodes[path]),
            "compute": spread(computes[path]),
            "total": spread(totals),
            "compute_seconds": [round(c, 3) for c in computes[path]],
            "decode_seconds": [round(d, 3) for d in decodes[path]],
            "peak_python_mb": round(traced[path].peak_python_mb, 1),
            "peak_arrow_mb": round(arrow_peaks[path], 1),
            # the two peaks need not coincide: their sum bounds the peak from above
            "peak_mb": round(traced[path].peak_python_mb + arrow_peaks[path], 1),
            "same_tallies_as_documents": same,
        }
        rows.append(row)
        log(
            f"  statistics step without the server, {size} jobs, {path}: decode {row['decode_median_seconds']:.2f} s + "
            f"compute {row['compute_median_seconds']:.2f} s (medians of {row['runs']}), peak {row['peak_python_mb']:.0f} MB Python "
            f"+ {row['peak_arrow_mb']:.0f} MB Arrow" + ("" if same else "  DIFFERENT TALLIES")
        )
    return rows
