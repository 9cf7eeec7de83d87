"""Measures 2-4: detection and statistics as the finished history grows.

Over 500 lines: the detection and the statistics measures share one growing history on one server, and read
together as the steps they take at each size.

One queue holds the same started jobs (zombies and healthy ones) and waiting
jobs throughout; finished jobs are added in steps (10k, 100k, 1M), and at each
step the same measures are taken (on one long-lived server,
:class:`benchmarks.servers.HistoryServer`; the cleanup itself is measured on a
fresh server per run by :mod:`benchmarks.cleanup_bench`):

* **detection**: :func:`zombie_pipeline.cleanup.detection.detect`, its commands and
  documents, and the server's ``explain`` of the stale query (plan, documents
  and keys examined);
* **statistics**: the duration statistics of the 7-day window as the Dagster
  assets compute them (one ``read_period`` per UTC day of the finished statuses
  the queue's generation declares, ``combine``, ``analyze`` with
  ``count_undated_jobs``), time split into database read and Python/pandas
  compute, peak memory, bytes; beside a naive version that loads whole documents
  into one DataFrame; and one daily partition alone (what it reads, what the
  server examines);
* **query plans** of the other queries a cleanup sends, on this server.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.cursor import Cursor

from benchmarks.cleanup_bench import CleanupSettings
from benchmarks.data import (
    QUEUE_GENERATION,
    History,
    Snapshot,
    add_finished_history,
    history_for,
)
from benchmarks.harness import (
    CommandCounter,
    drop_if_exists,
    explain_aggregate,
    explain_command,
    explain_find,
    measure,
    median,
    present,
)
from zombie_pipeline.cleanup.detection import detect, stale_filter, stale_pipeline
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache import Cache, cache_key_of_job
from zombie_pipeline.queue.generations import NEWEST_CACHE_GENERATION, QUEUE_GENERATIONS
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import FINISHED_STATUSES, ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workload import Workload
from zombie_pipeline.statistics import jobs_source, tallies
from zombie_pipeline.statistics.analysis import analyze
from zombie_pipeline.statistics.quantiles import PERCENTILES

QUEUE_DB = "bench_history_queue"
CACHE_DB = "bench_history_cache"
#: The generation of the benchmark's queue: the statuses a day reads are the finished ones it declares.
GENERATION = QUEUE_GENERATIONS[QUEUE_GENERATION]


@dataclass
class HistorySettings:
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)  # finished jobs
    stats_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    zombies: int = 1_000
    running: int = 200
    waiting: int = 100
    repeats: int = 3
    stats_repeats: int = 3
    slow_seconds: float = 120.0
    cleanup: CleanupSettings = field(default_factory=CleanupSettings)
    plans: bool = True


# --- timing the database side of a read -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0


class TimedCursor:
    """A cursor whose ``next`` (network, server and BSON decoding) is timed."""

    def __init__(self, cursor: Cursor, clock: Clock) -> None:
        self._cursor = cursor
        self._clock = clock

    def __iter__(self) -> TimedCursor:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        try:
            return next(self._cursor)
        finally:
            self._clock.seconds += time.perf_counter() - started

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._cursor, name)
        if not callable(attribute):
            return attribute

        def chained(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            return TimedCursor(result, self._clock) if isinstance(result, Cursor) else result

        return chained


class TimedCollection:
    """A collection whose every call (``find``, ``distinct``, ``count_documents``...) is timed;
    cursors it returns are timed as they are iterated."""

    def __init__(self, collection: Any, clock: Clock) -> None:
        self._collection = collection
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._collection, name)
        if not callable(attribute):
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                result = attribute(*args, **kwargs)
            finally:
                self._clock.seconds += time.perf_counter() - started
            return TimedCursor(result, self._clock) if isinstance(result, Cursor) else result

        return timed


def timed_collection(collection: Any, clock: Clock) -> Collection[Any]:
    """``collection`` as a :class:`TimedCollection`, typed as the collection it stands in for."""
    return cast("Collection[Any]", TimedCollection(collection, clock))


def day_filters(start: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """The queries ``read_period`` sends for the jobs of ``[start, end)``: one per finished status of the generation."""
    return [jobs_source.finished_jobs_filter(status, start, end) for status in jobs_source.statuses_to_read(GENERATION)]


# --- statistics: ours and the naive version ------------------------------------------------


def days_of(history: History) -> list[tuple[dt.datetime, dt.datetime]]:
    return [
        (history.first_day + dt.timedelta(days=i), history.first_day + dt.timedelta(days=i + 1))
        for i in range(history.days)
    ]


def statistics_ours(jobs: Any, events: Any, history: History, policy: ZombiePolicy, clock: Clock) -> dict[str, Any]:
    """The window as the assets compute it: a ``read_period`` per day, then ``combine`` and ``analyze``."""
    timed_jobs, timed_events = timed_collection(jobs, clock), timed_collection(events, clock)
    periods = [
        jobs_source.read_period(timed_jobs, timed_events, start, end, generation=GENERATION)
        for start, end in days_of(history)
    ]
    period = tallies.combine(periods)
    report = analyze(period, policy, undated=jobs_source.count_undated_jobs(timed_jobs, GENERATION))
    return {"jobs_read": period.jobs_read, "types": len(report.types)}


def statistics_naive(jobs: Any, history: History, clock: Clock) -> dict[str, Any]:
    """Whole documents of the window into one DataFrame, then the same percentiles per type."""
    start, end = history.window
    timed = TimedCollection(jobs, clock)
    documents = []
    for status in sorted(FINISHED_STATUSES):  # the same index-friendly queries as ours, without projection
        documents.extend(timed.find({Job.STATUS: status, Job.FINISHED_AT: {"$gte": start, "$lt": end}}))
    frame = pd.DataFrame(documents)
    frame["seconds"] = (frame[Job.FINISHED_AT] - frame[Job.STARTED_AT]).dt.total_seconds()
    counts = frame.groupby([Job.TYPE, Job.STATUS]).size()
    success = frame[frame[Job.STATUS] == Status.SUCCESS]
    table = success.groupby(Job.TYPE)["seconds"].describe(percentiles=list(PERCENTILES))
    return {"jobs_read": len(documents), "types": len(table), "groups": len(counts)}


def statistics_day(jobs: Any, events: Any, start: dt.datetime, end: dt.datetime, clock: Clock) -> dict[str, Any]:
    period = jobs_source.read_period(
        timed_collection(jobs, clock), timed_collection(events, clock), start, end, generation=GENERATION
    )
    return {"jobs_read": period.jobs_read}


# --- the whole history section ----------------------------------------------------------------


class HistoryBench:
    def __init__(
        self,
        handle: Any,  # benchmarks.servers.HistoryServer: embedded, rss_mb()
        setup_client: MongoClient,
        measured_client: MongoClient,
        counter: CommandCounter,
        settings: HistorySettings,
        log: Callable[[str], None],
        emit: Callable[[str, list[dict[str, Any]]], None],
    ) -> None:
        self.handle = handle
        self.setup_client = setup_client
        self.measured_client = measured_client
        self.counter = counter
        self.settings = settings
        self.log = log
        self.emit = emit  # emit(section, rows): results are written as soon as they exist
        self.policy = ZombiePolicy(max_stale_fraction=1.0, batch_size=settings.cleanup.batch_size)

    def run(self) -> None:
        s = self.settings
        drop_if_exists(self.setup_client, QUEUE_DB, CACHE_DB)
        setup_store = Store.of(self.setup_client[QUEUE_DB], self.setup_client[CACHE_DB])
        setup_store.ensure_indexes()
        never = s.zombies // 10
        workload = Workload(
            finished=0,
            crashed=s.zombies - 2 * never,
            never_heartbeated=never,
            overdue=never,
            running=s.running,
            waiting=s.waiting,
            seed=7,
            generation=QUEUE_GENERATION,
            cache_generation=NEWEST_CACHE_GENERATION,
        )
        simulation = simulate(setup_store, workload)
        self.now = simulation.now
        self.snapshot = Snapshot.take(setup_store, simulation)
        self.setup_store = setup_store
        self.measured_store = Store.of(self.measured_client[QUEUE_DB], self.measured_client[CACHE_DB])
        self.history = history_for(simulation.now)
        self.live_jobs = workload.total
        self.log(
            f"history queue: {workload.total} started/waiting jobs ({s.zombies} zombies); window {self.history.window[0]:%Y-%m-%d} .. {self.history.window[1]:%Y-%m-%d}"
        )
        try:
            for size in sorted(s.sizes):
                started = time.perf_counter()
                add_finished_history(setup_store.jobs, self.history, size - self.history.total)
                insert_seconds = time.perf_counter() - started
                self.log(
                    f"  {self.history.total} finished jobs ({insert_seconds:.0f} s to add); server RSS {self.handle.rss_mb() or 0:.0f} MB"
                )
                self.detection(size, insert_seconds)
                if s.plans:
                    self.plans(size)
                if size in s.stats_sizes:
                    self.statistics(size)
        finally:
            if not self.handle.embedded:
                drop_if_exists(self.setup_client, QUEUE_DB, CACHE_DB)

    # detection -----------------------------------------------------------------------------

    def detection(self, size: int, insert_seconds: float) -> None:
        s = self.settings
        jobs = self.measured_store.jobs
        traced = measure(lambda: detect(jobs, self.policy, self.now), self.counter, trace_memory=True)
        walls = []
        for _ in range(s.repeats if traced.wall_seconds < s.slow_seconds else 0):
            walls.append(measure(lambda: detect(jobs, self.policy, self.now), self.counter).wall_seconds)
        walls = walls or [traced.wall_seconds]
        explained = explain_aggregate(
            self.setup_store.jobs, stale_pipeline(self.policy, self.now)
        )  # as detect sends it
        candidates = len(traced.result.candidates)
        row = {
            "section": "detection",
            "finished_jobs": size,
            "queue_jobs": size + self.live_jobs,
            "zombies_found": candidates,
            "runs": len(walls),
            "wall_seconds": [round(w, 3) for w in walls],
            "wall_median_seconds": round(present(median(walls)), 3),
            "commands": traced.counts["commands"],
            "docs_returned": traced.counts["docs_returned"],
            "bytes_received": traced.counts["bytes_received"],
            "round_trip_seconds_by_command": traced.counts["round_trip_seconds_by_command"],
            "peak_python_mb": round(present(traced.peak_python_mb), 2),
            "docs_examined": explained["docs_examined"],
            "keys_examined": explained["keys_examined"],
            "plan": explained["plan"],
            "explain_server_ms": explained["server_ms"],
            "server_rss_mb": round(self.handle.rss_mb() or 0, 0) or None,
            "insert_seconds": round(insert_seconds, 1),
        }
        self.log(
            f"    detection: {row['wall_median_seconds']:.2f} s, {candidates} zombies, examined {row['docs_examined']} docs / "
            f"{row['keys_examined']} keys, plan {row['plan']}"
        )
        self.emit("detection", [row])

    # query plans of the other queries ----------------------------------------------------------

    def plans(self, size: int) -> None:
        policy, now = self.policy, self.now
        jobs, cache = self.setup_store.jobs, self.setup_store.cache
        zombies = self.snapshot.zombie_jobs[: policy.batch_size]
        keys = [cache_key_of_job(job) for job in zombies]
        unicity_ids = sorted(job[Job.UNICITY_ID] for job in zombies)
        day_start, day_end = days_of(self.history)[len(days_of(self.history)) // 2]
        day_queries = day_filters(day_start, day_end)
        shapes: list[tuple[str, Any, Any, Any, Any]] = [
            (
                "detection: stale query as detect sends it (two $match stages)",
                jobs,
                stale_pipeline(policy, now),
                None,
                None,
            ),
            ("detection: the same as one find with its $or (not sent)", jobs, stale_filter(policy, now), None, None),
            (
                "statistics: one day, successful jobs (a read_period query)",
                jobs,
                next((q for q in day_queries if q.get(Job.STATUS) == Status.SUCCESS), day_queries[0]),
                None,
                None,
            ),
            (
                "statistics: one day, status $nin (one-query shape)",
                jobs,
                {
                    Job.STATUS: {"$nin": [Status.WAITING, Status.STARTED]},
                    Job.FINISHED_AT: {"$gte": day_start, "$lt": day_end},
                },
                None,
                None,
            ),
            (
                "cache errors: entries of one kind, as sent (kind =, dataset $in)",
                cache,
                {
                    Cache.KIND: keys[0][Cache.KIND],
                    Cache.DATASET: {
                        "$in": sorted({k[Cache.DATASET] for k in keys if k[Cache.KIND] == keys[0][Cache.KIND]})
                    },
                },
                None,
                None,
            ),
            (
                f"cache errors: entries of {len(keys)} jobs in one query (kind $in, dataset $in; not sent)",
                cache,
                {
                    Cache.KIND: {"$in": sorted({k[Cache.KIND] for k in keys})},
                    Cache.DATASET: {"$in": sorted({k[Cache.DATASET] for k in keys})},
                },
                None,
                None,
            ),
            (
                f"finalize read-back: _id $in {len(zombies)}",
                jobs,
                {ID: {"$in": [job[ID] for job in zombies]}},
                None,
                None,
            ),
            (
                f"retries: unicity_id $in {len(zombies)}, then status $in, as sent (two $match stages)",
                jobs,
                on_index(
                    {Job.UNICITY_ID: {"$in": unicity_ids}}, {Job.STATUS: {"$in": [Status.WAITING, Status.STARTED]}}
                ),
                None,
                None,
            ),
            (
                "retries: the same as one find (not sent)",
                jobs,
                {Job.UNICITY_ID: {"$in": unicity_ids}, Job.STATUS: {"$in": [Status.WAITING, Status.STARTED]}},
                None,
                None,
            ),
            ("baseline: every started job", jobs, {Job.STATUS: Status.STARTED}, None, None),
        ]
        rows = []
        for name, collection, query, sort, projection in shapes:
            if isinstance(query, list):
                explained = explain_aggregate(collection, query)
            else:
                explained = explain_find(collection, query, sort=sort, projection=projection)
            rows.append({"section": "plans", "finished_jobs": size, "query": name, **explained})
            self.log(
                f"    plan {name}: {explained['plan']} examined {explained['docs_examined']} docs in {explained['explain_seconds']:.2f} s"
            )
        self.emit("plans", rows)

    # statistics ---------------------------------------------------------------------------------

    def statistics(self, size: int) -> None:
        s = self.settings
        jobs, events = self.measured_store.jobs, self.measured_store.events
        history = self.history
        rows = []
        variants = {
            "ours (daily partitions)": lambda clock: statistics_ours(jobs, events, history, self.policy, clock),
            "naive (whole documents)": lambda clock: statistics_naive(jobs, history, clock),
        }
        for name, call in variants.items():
            # traced run: peak memory and bytes on the wire (both slow the run down, so no time is taken from it)
            self.counter.measure_bytes = True
            traced_clock = Clock()
            traced = measure(lambda: call(traced_clock), self.counter, trace_memory=True)
            self.counter.measure_bytes = False  # re-encoding replies to size them would be timed too
            reads, computes, walls = [], [], []
            # at least one untraced run (tracemalloc slows Python down), unless none is asked (smoke test)
            for _ in range(
                min(s.stats_repeats, max(1, s.stats_repeats if traced.wall_seconds < s.slow_seconds else 1))
            ):
                clock = Clock()
                m = measure(lambda: call(clock), self.counter)
                walls.append(m.wall_seconds)
                reads.append(clock.seconds)
                computes.append(m.wall_seconds - clock.seconds)
            self.counter.measure_bytes = True
            from_traced = not walls
            if from_traced:
                walls, reads, computes = (
                    [traced.wall_seconds],
                    [traced_clock.seconds],
                    [traced.wall_seconds - traced_clock.seconds],
                )
            row = {
                "section": "statistics",
                "finished_jobs": size,
                "variant": name,
                "jobs_read": traced.result["jobs_read"],
                "runs": len(walls),
                "wall_median_seconds": round(present(median(walls)), 3),
                "read_median_seconds": round(present(median(reads)), 3),
                "compute_median_seconds": round(present(median(computes)), 3),
                "compute_seconds": [round(c, 3) for c in computes],
                "peak_python_mb": round(present(traced.peak_python_mb), 1),
                "commands": traced.counts["commands"],
                "commands_by_name": traced.counts["commands_by_name"],
                "round_trip_seconds_by_command": traced.counts["round_trip_seconds_by_command"],
                "docs_returned": traced.counts["docs_returned"],
                "bytes_received": traced.counts["bytes_received"],
                "traced_wall_seconds": round(traced.wall_seconds, 1),
                "times_from_traced_run": from_traced,
            }
            rows.append(row)
            self.log(
                f"    statistics {name}: read {row['read_median_seconds']:.2f} s + compute {row['compute_median_seconds']:.2f} s, "
                f"peak {row['peak_python_mb']:.0f} MB, {row['bytes_received'] / 1e6:.1f} MB received"
            )
        # one daily partition alone: what it reads, and what the server examines for it
        day_start, day_end = days_of(history)[len(days_of(history)) // 2]
        clock = Clock()
        self.counter.measure_bytes = True
        day = measure(lambda: statistics_day(jobs, events, day_start, day_end, clock), self.counter)
        explains = [
            explain_find(self.setup_store.jobs, query, projection=jobs_source._JOB_PROJECTION)
            for query in day_filters(day_start, day_end)
        ]
        plan = f"{len(explains)} finds, first: {explains[0]['plan']}"
        if day.counts["commands_by_name"].get("distinct"):  # read_period asks which statuses exist
            distinct = explain_command(
                self.setup_store.jobs.database, {"distinct": self.setup_store.jobs.name, "key": Job.STATUS}
            )
            explains.append(distinct)
            plan += f"; distinct(status): {distinct['plan']}"
        explained = {
            "docs_examined": sum(e["docs_examined"] or 0 for e in explains),
            "keys_examined": sum(e["keys_examined"] or 0 for e in explains),
            "plan": plan,
        }
        expected = history.by_day[day_start.date().isoformat()]
        rows.append(
            {
                "section": "statistics",
                "finished_jobs": size,
                "variant": f"one daily partition ({day_start:%Y-%m-%d})",
                "jobs_read": day.result["jobs_read"],
                "jobs_finished_that_day": expected,
                "runs": 1,
                "wall_median_seconds": round(day.wall_seconds, 3),
                "read_median_seconds": round(clock.seconds, 3),
                "compute_median_seconds": round(day.wall_seconds - clock.seconds, 3),
                "commands": day.counts["commands"],
                "commands_by_name": day.counts["commands_by_name"],
                "round_trip_seconds_by_command": day.counts["round_trip_seconds_by_command"],
                "docs_returned": day.counts["docs_returned"],
                "bytes_received": day.counts["bytes_received"],
                "docs_examined": explained["docs_examined"],
                "keys_examined": explained["keys_examined"],
                "plan": explained["plan"],
            }
        )
        self.log(
            f"    daily partition: read {day.result['jobs_read']} jobs (that day: {expected}); server examined "
            f"{explained['docs_examined']} docs / {explained['keys_examined']} keys ({explained['plan']})"
        )
        self.emit("statistics", rows)
