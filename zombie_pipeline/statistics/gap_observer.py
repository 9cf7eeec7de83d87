"""The heartbeat gaps of live jobs, measured by watching the started jobs refresh after refresh.

A watcher re-reads the started jobs every second or two and hands each refresh to its listeners
(:class:`zombie_pipeline.cleanup.watch.Listener`). :class:`GapObserver` is one, handed to every watch by
``zombie_watch_job``: it follows each job's signs of life (its start, then every new ``last_heartbeat``) and counts
the time between two of them as a *gap* of the job's type, on the worker size its ``difficulty`` sends it to (where
the queue records one). What it counts, and what it leaves out as seen only in part, is :mod:`.gap_tallies`' to say;
the rules in short:

- a job first seen before its first heartbeat has its first gap counted from its start, and is *watched
  whole*: every silence of its life is seen;
- a gap that ended while the watcher looked away for longer than ``max_blind_seconds`` (a slow read, an
  outage) may hold a heartbeat it never saw: ``unobserved``, not a sample (its job is no longer watched whole);
- a job that leaves the started jobs is told apart at the next flush, from what the database holds: finalized
  by one of our cleanups (the audit trail has its event), gone after a silence the deployment's own killer acts
  on (``ended_unseen``), or finished, its last silence counted in its longest one.

:meth:`GapObserver.flush` records it all with :mod:`.gap_log`, once, however often a flush is sent again;
a flush the database refused is kept whole and sent first at the next one. No Dagster, no numpy.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import WORKER_UNTOLD
from zombie_pipeline.queue.indexes import HEARTBEAT_GAP_INDEXES, ensure_indexes
from zombie_pipeline.queue.jobs import ID, Job, job_type_problem
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.queue.worker_type_counts import worker_size
from zombie_pipeline.statistics.gap_log import GapBatch, prune, write_batch
from zombie_pipeline.statistics.gap_tallies import GapKey

#: The fields of a started job the observer reads: the watcher's projection (``cleanup.watch.WATCHED_FIELDS``) holds
#: them (``difficulty`` from 2023-07).
OBSERVED_FIELDS = (ID, Job.TYPE, Job.STARTED_AT, Job.LAST_HEARTBEAT, Job.DIFFICULTY)
#: A refresh this long after the previous one may have missed a heartbeat: the gaps it ends are not samples.
MAX_BLIND_SECONDS = 15.0
#: Ended jobs looked up in the audit trail per query.
LOOKUP_BATCH = 1_000


@dataclass
class _Watch:
    """One started job as the observer follows it."""

    key: GapKey
    started_at: dt.datetime
    last_sign: dt.datetime  # its latest heartbeat seen, else its start
    last_seen: dt.datetime  # the last refresh that held it
    whole: bool  # seen before its first heartbeat, and never lost from sight since: every silence of its life seen
    longest: float = 0.0  # its longest gap seen complete


@dataclass(frozen=True)
class _Ended:
    """A job gone from the started jobs, to be told apart at the next flush."""

    job_id: Any
    key: GapKey
    day: str  # of the last refresh that held it
    silence_seen: float  # its last sign of life to the last refresh that held it: a silence it lived through
    silence_at_most: float  # to the refresh that found it gone
    longest: float
    whole: bool


class GapObserver:
    """A watcher's listener (``cleanup.watch.Listener``) that measures heartbeat gaps (see the module docstring)."""

    def __init__(self, policy: ZombiePolicy | None = None, max_blind_seconds: float = MAX_BLIND_SECONDS) -> None:
        policy = policy or ZombiePolicy()
        self.deployment_timeout_seconds = policy.deployment_heartbeat_timeout_seconds()
        self.max_blind_seconds = max_blind_seconds
        self.skipped: Counter[str] = Counter()  # started jobs left out, by what was wrong with them
        self._watched: dict[Any, _Watch] = {}
        self._ended: list[_Ended] = []
        self._pending = GapBatch(_flush_id())
        self._refused: GapBatch | None = None  # a flush whose write failed: sent again, under its id, first
        self._previous: dt.datetime | None = None
        self._pruned_on: dt.date | None = None
        self._indexed = False

    @property
    def watched(self) -> int:
        return len(self._watched)

    def observe(self, jobs: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
        """One refresh of the started jobs, read at ``now``."""
        now = utc(now)
        blind = self._previous is not None and (now - self._previous).total_seconds() > self.max_blind_seconds
        seen = set()
        for job in jobs:
            read = self._read(job)
            if read is None:
                continue
            job_id, key, started_at, heartbeat = read
            seen.add(job_id)
            watch = self._watched.get(job_id)
            if watch is None or watch.started_at != started_at:  # first seen (or a new run of the same document)
                sign = heartbeat or started_at
                self._watched[job_id] = _Watch(key, started_at, sign, now, whole=heartbeat is None)
                continue
            watch.last_seen = now
            if heartbeat is not None and heartbeat > watch.last_sign:
                gap = (heartbeat - watch.last_sign).total_seconds()
                tally = self._pending.tally(heartbeat.date().isoformat(), watch.key)
                if blind:
                    tally.unobserved += 1
                    watch.whole = False
                else:
                    tally.gaps.add(gap)
                    watch.longest = max(watch.longest, gap)
                watch.last_sign = heartbeat
        for job_id in [job_id for job_id in self._watched if job_id not in seen]:
            watch = self._watched.pop(job_id)
            self._ended.append(
                _Ended(
                    job_id,
                    watch.key,
                    watch.last_seen.date().isoformat(),
                    silence_seen=(watch.last_seen - watch.last_sign).total_seconds(),
                    silence_at_most=(now - watch.last_sign).total_seconds(),
                    longest=watch.longest,
                    whole=watch.whole and not blind,
                )
            )
        self._previous = now

    def _read(self, job: Mapping[str, Any]) -> tuple[Any, GapKey, dt.datetime, dt.datetime | None] | None:
        """A job's id, (type, worker size), start and heartbeat; None (counted in :attr:`skipped`) when unreadable."""
        job_type, started_at = job.get(Job.TYPE), as_utc(job.get(Job.STARTED_AT))
        heartbeat = job.get(Job.LAST_HEARTBEAT)
        problem = job_type_problem(job_type)
        if ID not in job:
            problem = "no _id"
        elif started_at is None:
            problem = "started_at is not a date"
        elif heartbeat is not None and as_utc(heartbeat) is None:
            problem = "last_heartbeat is not a date"
        if problem is not None:
            self.skipped[problem] += 1
            return None
        assert isinstance(job_type, str) and started_at is not None
        difficulty = job.get(Job.DIFFICULTY)
        told = isinstance(difficulty, (int, float)) and not isinstance(difficulty, bool)
        return job[ID], (job_type, worker_size(difficulty) if told else WORKER_UNTOLD), started_at, as_utc(heartbeat)

    def flush(self, store: Store, now: dt.datetime) -> None:
        """Record what was observed since the last flush. A database error is raised and nothing is lost: the next
        flush sends a refused write again under the same id (applied once, whether or not it had been)."""
        now = utc(now)
        if not self._indexed:
            ensure_indexes(store.heartbeat_gaps, HEARTBEAT_GAP_INDEXES)
            self._indexed = True
        if self._refused is not None:
            write_batch(store.heartbeat_gaps, self._refused, now)
            self._refused = None
        self._tell_ended(store)
        batch, self._pending = self._pending, GapBatch(_flush_id())
        if not batch.empty:
            self._refused = batch
            write_batch(store.heartbeat_gaps, batch, now)
            self._refused = None
        if self._pruned_on != now.date():
            prune(store.heartbeat_gaps, now.date())
            self._pruned_on = now.date()

    def _tell_ended(self, store: Store) -> None:
        """Each job gone since the last flush: finalized by us (its event), ended unseen, or finished."""
        if not self._ended:
            return
        ids = [ended.job_id for ended in self._ended]
        ours = set()
        for start in range(0, len(ids), LOOKUP_BATCH):
            ours |= {
                event[ID] for event in store.events.find({ID: {"$in": ids[start : start + LOOKUP_BATCH]}}, {ID: 1})
            }
        for ended in self._ended:
            tally = self._pending.tally(ended.day, ended.key)
            if ended.job_id in ours:
                tally.finalized += 1
            elif (
                self.deployment_timeout_seconds is not None and ended.silence_at_most >= self.deployment_timeout_seconds
            ):
                tally.ended_unseen += 1
            elif ended.whole:
                tally.finished.add(max(ended.longest, ended.silence_seen))
            else:
                tally.partly_watched += 1
        self._ended = []


def _flush_id() -> str:
    return uuid.uuid4().hex
