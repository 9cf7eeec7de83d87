"""Simulated live workers: a queue that moves, as a deployment's workers move it, for hours.

Over 500 lines: :class:`WorkerPool` is a worker's whole life (take, start, heartbeat, finish, die) as the
deployment's loop lives it, read top to bottom.

Each worker takes the oldest waiting job whose user (namespace) runs nothing
yet, starts it as the deployment does (the start lock, a compare-and-set from
waiting, the counters), heartbeats every ``heartbeat_seconds``, and finishes it
after a duration drawn from its type's law: the cache entry first, then the job
finished as the generation finishes one (kept with its status, or deleted with
the counters, ``pastJobs`` and the lock). A job that reaches its type's maximum
duration (T2) is stopped by its own worker with the deployment's error, as the
deployment's ``kill_long_job`` does. New waiting jobs arrive so the queue never
dries up.

A steady state, at documented rates (:class:`WorkerRates`), counted in hours of
a worker's busy time, so that they hold whatever ``speed`` does to the jobs:

- a crash (``crashes_per_worker_hour``): the worker dies at a random moment of
  its job, silently (a zombie: missing heartbeat, or never heartbeated if it
  dies before its first beat) or, where jobs record it, after a SIGTERM
  (``terminated_share``); its pod is replaced ``restart_seconds`` later by a
  fresh worker, which takes a new job;
- an overrun (``overruns_per_worker_hour``): the job's own T2 killer fails and
  the job runs on, heartbeating, to 1.1-1.5 times T2 (a zombie past its
  maximum duration), never on more than ``max_overrunning_share`` of the
  workers at once. A worker whose job a cleanup finalized sees it at its next
  heartbeat and takes another one.

So the dead jobs a cleanup finds grow by ``workers x crashes_per_worker_hour``
an hour, beside the ``workers`` healthy started jobs: with the defaults, a
queue nobody cleans stays below the brake (more than half of the started jobs
dead) for over 10 hours, and every cleanup finds a small share dead.

Time is real: heartbeats and thresholds are the policy's; ``speed`` shortens
the jobs' durations only. The pool reads time through ``clock`` (seconds, for
its schedule) and ``now`` (the dates it writes), so a test can drive it through
an hour in a moment. :meth:`WorkerPool.stop` finishes the jobs still in flight,
in a few commands for all of them, so a pool that is stopped leaves no false
zombie behind, within seconds.

Run for hours (:meth:`WorkerPool.run`), a pool says once a minute what it did,
outlives a database that stops answering (it tries again, waiting up to
:data:`OUTAGE_MAX_WAIT_SECONDS` between attempts, and says so once an outage),
and is the only one on its queue when given a :class:`QueueClaim`: a second
process is refused, and the claim of a process that was killed expires.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import os
import random
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pymongo
from pymongo import ReplaceOne, UpdateOne
from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from zombie_pipeline.messages import counted, plural, shown
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.cache import (
    CACHE_CONTENT_ERROR,
    DEFAULT_ZOMBIE_HTTP_STATUS,
    HTTP_OK,
    Cache,
    CacheEntry,
    CacheMetric,
    ErrorCode,
    cache_key_of_job,
)
from zombie_pipeline.queue.cache_entries import failed_runs_after_crash, stored_failed_runs
from zombie_pipeline.queue.generations import CACHE_GENERATIONS, FailedRunsRule, QueueGeneration
from zombie_pipeline.queue.jobs import ID, Job, JobDocument, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.deployment_writes import DeploymentWrites
from zombie_pipeline.simulation.marks import SIMULATED_WORKERS_COLLECTION, WorkersClaim
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.workload import JOB_TYPES, JobType, WorkloadError

#: An overrunning job runs on to this many times its T2 before it ends by itself.
OVERRUN_FACTORS = (1.1, 1.5)
#: The error of a job whose own worker fails (the deployment's generic one).
WORKER_ERROR_CODE = "UnexpectedError"
#: New waiting jobs are topped up to at least this many.
MIN_WAITING = 20
#: The users new jobs come from: enough that the queue's one started job per user rarely leaves a worker idle.
USERS = 5_000
#: How often a pool run for long says what it did.
REPORT_SECONDS = 60.0
#: While the database does not answer, the pool tries again 1 s later, then twice as long each time, up to this.
OUTAGE_MAX_WAIT_SECONDS = 30.0
#: Jobs finished per round of commands when the pool stops (a longer list of ids costs the embedded server more).
FINISH_BATCH_SIZE = 100


@dataclass(frozen=True)
class WorkerRates:
    """How the simulated workers behave; every rate is per hour of a worker's busy time."""

    workers: int = 4  # at least this many; a pool that adopts started jobs has a worker for each
    crashes_per_worker_hour: float = 0.05  # a worker dies about once a day of work
    overruns_per_worker_hour: float = 0.02  # a job whose own T2 killer fails, and runs on past T2
    max_overrunning_share: float = 0.1  # of the workers (at least one) holding an overrunning job at once
    terminated_share: float = 0.25  # of the crashes, SIGTERMs the job records (where jobs have terminated_at)
    restart_seconds: float = 30.0  # a crashed worker's pod is replaced after this
    speed: float = 1.0  # job durations are the type's, times this
    heartbeat_seconds: float = 60.0
    waiting_target: int | None = None  # waiting jobs kept; None: as many as the workers, at least MIN_WAITING

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.workers, int) or self.workers < 1:
            problems.append(f"workers must be a positive integer, got {shown(self.workers)}")
        for name in ("crashes_per_worker_hour", "overruns_per_worker_hour", "restart_seconds"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be zero or more, got {shown(getattr(self, name))}")
        for name in ("max_overrunning_share", "terminated_share"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be in [0, 1], got {shown(getattr(self, name))}")
        for name in ("speed", "heartbeat_seconds"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be positive, got {shown(getattr(self, name))}")
        if self.waiting_target is not None and (not isinstance(self.waiting_target, int) or self.waiting_target < 0):
            problems.append(f"waiting_target must be a non-negative integer, got {shown(self.waiting_target)}")
        if problems:
            raise WorkloadError("invalid worker rates: " + "; ".join(problems))


def passing(error: pymongo.errors.PyMongoError) -> bool:
    """Whether waiting may help: a connection lost or refused, a server not chosen, an answer that did not come in
    time. A command the server refused (a right missing, a document refused) would be refused again."""
    return isinstance(error, pymongo.errors.ConnectionFailure) or error.timeout


class WorkersRunning(RuntimeError):
    """Another process runs the simulated workers of this queue: the message says which, and how to go on."""


@dataclass
class QueueClaim:
    """The one process of simulated workers a queue has: a document in our own collection, renewed while it runs.

    Two processes of workers on one queue would both adopt its started jobs, heartbeat and finish them twice and
    race for its locks. A claim not renewed for :attr:`expires_seconds` is that of a process that was killed: the
    next one takes it over.
    """

    collection: Collection[dict[str, Any]]
    now: Callable[[], dt.datetime] = utc_now
    expires_seconds: float = 60.0
    renew_seconds: float = 10.0
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    renewed: float = -math.inf  # time.monotonic() of the last renewal

    KEY = "workers"  # the claim's _id: one per queue database

    @classmethod
    def of(cls, store: Store, **options: Any) -> QueueClaim:
        return cls(store.beside_queue(SIMULATED_WORKERS_COLLECTION), **options)

    def take(self) -> None:
        """Claim the queue, or raise :class:`WorkersRunning` naming the process that has it."""
        now = self.now()
        claim = {
            ID: self.KEY,
            WorkersClaim.OWNER: self.owner,
            WorkersClaim.PID: os.getpid(),
            WorkersClaim.HOST: socket.gethostname(),
            WorkersClaim.STARTED_AT: now,
            WorkersClaim.RENEWED_AT: now,
        }
        for _ in range(2):  # a claim released between the insert and the take-over: the insert again
            try:
                self.collection.insert_one(claim)
                break
            except DuplicateKeyError:
                expired = {
                    ID: self.KEY,
                    WorkersClaim.RENEWED_AT: {"$lt": now - dt.timedelta(seconds=self.expires_seconds)},
                }
                if self.collection.find_one_and_replace(expired, claim) is not None:
                    break
                holder = self.collection.find_one({ID: self.KEY})
                if holder is not None:
                    raise WorkersRunning(
                        f"simulated workers already run on this queue (pid {holder.get(WorkersClaim.PID)} on "
                        f"{holder.get(WorkersClaim.HOST)}, since {holder[WorkersClaim.STARTED_AT]:%Y-%m-%d %H:%M:%S} "
                        f"UTC): stop them first (Ctrl-C where they run); a process killed without stopping is taken "
                        f"over {self.expires_seconds:g} s after it last renewed its claim"
                    ) from None
        self.renewed = time.monotonic()

    def renew(self) -> None:
        """Say the claim is alive, every :attr:`renew_seconds`; :class:`WorkersRunning` if another process took it
        over meanwhile (this one could not renew it for :attr:`expires_seconds`: the database was out of reach)."""
        if time.monotonic() - self.renewed < self.renew_seconds:
            return
        renewed = self.collection.update_one(
            {ID: self.KEY, WorkersClaim.OWNER: self.owner}, {"$set": {WorkersClaim.RENEWED_AT: self.now()}}
        )
        if renewed.matched_count == 0:
            raise WorkersRunning(
                "another process of simulated workers took this queue over while this one could not renew its claim "
                f"(for {self.expires_seconds:g} s): stopping, leaving the jobs it held to that one"
            )
        self.renewed = time.monotonic()

    def release(self) -> None:
        self.collection.delete_one({ID: self.KEY, WorkersClaim.OWNER: self.owner})


def plain_error(error: pymongo.errors.PyMongoError, doing: str) -> str:
    """A database error in one line, for a pool whose caller gives no better words (``WorkerPool.explain``)."""
    return f"{doing}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _duration(seconds: float) -> str:
    """``60`` -> ``minute``, ``90`` -> ``90 s``: the span a report line covers."""
    return "minute" if seconds == 60 else f"{seconds:g} s"


def _tally(done: Counter[Any]) -> str:
    """What workers did, as it happened: started, finished, died, finalized under them, enqueued."""
    finished, stopped = done["finished_success"] + done["finished_error"], done["stopped_at_max_duration"]
    terminated = f" ({done['terminated']} after a SIGTERM)" if done["terminated"] else ""
    return (
        f"{done['started']} started, {finished} finished ({done['finished_error']} in error, {stopped} stopped at "
        f"{plural(stopped, 'its', 'their')} maximum duration), {done['died']} died{terminated}, "
        f"{done['finished_by_someone_else']} finalized by a cleanup, {done['enqueued']} enqueued"
    )


def _sleep(seconds: float, stop: Callable[[], bool]) -> None:
    """Sleep ``seconds``, or less once ``stop()`` says so (it is asked every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while not stop() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


class Fate(enum.Enum):
    """How a started job ends."""

    SUCCESS = "success"
    ERROR = "error"  # the job fails on its own
    STOPPED_AT_T2 = "stopped_at_t2"  # its worker stops it at its maximum duration, as the deployment does
    OVERRUN = "overrun"  # its worker's T2 killer failed: it runs on past T2, then succeeds
    CRASH = "crash"  # its worker dies: the job stays started


@dataclass
class _Run:
    job: JobDocument
    ends_at: float  # clock seconds: when it finishes, or when its worker dies
    next_beat: float
    fate: Fate
    terminated: bool = False  # a crash after a SIGTERM the job records


@dataclass
class WorkerPool:
    """Workers sharing one queue; :meth:`tick` moves each of them one step."""

    store: Store
    generation: QueueGeneration
    policy: ZombiePolicy = field(default_factory=ZombiePolicy)
    rates: WorkerRates = field(default_factory=WorkerRates)
    seed: int = 0
    job_types: tuple[JobType, ...] = JOB_TYPES
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], dt.datetime] = utc_now
    counts: Counter[Any] = field(default_factory=Counter)
    say: Callable[[str], None] = lambda line: None  # a line a minute of what they did, and each outage
    explain: Callable[[pymongo.errors.PyMongoError, str], str] = plain_error  # a database error, and what was done
    claim: QueueClaim | None = None  # renewed while :meth:`run` runs, released by :meth:`stop`
    report_seconds: float = REPORT_SECONDS  # how often :meth:`run` says what the workers did

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.runs: list[_Run | None] = [None] * self.rates.workers
        self.restart_at: list[float] = [0.0] * self.rates.workers  # a replaced pod takes work from then on
        self.writes = DeploymentWrites(self.store, self.generation)  # the deployment's, not the cleanup's
        self.cache_generation = CACHE_GENERATIONS[self.generation.cache_generation]
        self.types = {job_type.name: job_type for job_type in self.job_types}
        self._openings: tuple[set[Any], set[Any], list[Any]] | None = None
        self.died: list[Any] = []  # the ids of the jobs whose worker died on them: zombies until a cleanup finds them
        self.doing = "starting"  # what the pool is doing, for a database error to name it

    @property
    def workers(self) -> int:
        return len(self.runs)

    def adopt_running(self) -> int:
        """Take over the started jobs that look alive (a recent heartbeat or start), a worker for each: they are
        the simulated deployment's healthy jobs, and the pool keeps as many workers busy from then on."""
        cutoff = self.now() - dt.timedelta(seconds=self.policy.heartbeat_timeout_seconds)
        alive = self.store.jobs.find(
            {
                Job.STATUS: Status.STARTED,
                Job.TERMINATED_AT: None,
                "$or": [
                    {Job.LAST_HEARTBEAT: {"$gte": cutoff}},
                    {Job.LAST_HEARTBEAT: None, Job.STARTED_AT: {"$gte": cutoff}},
                ],
            }
        )
        now = self.clock()
        adopted = [job for job in alive if self._seconds_run(job) < self.policy.max_duration_of(job[Job.TYPE])]
        idle = [index for index, run in enumerate(self.runs) if run is None]
        for job in adopted:  # past its T2 already: a zombie to clean, not a job to run (left out above)
            run = self._plan(job, now, already_run=self._seconds_run(job))
            if idle:
                self.runs[idle.pop(0)] = run
            else:
                self.runs.append(run)
                self.restart_at.append(0.0)
        self.counts["adopted"] += len(adopted)
        return len(adopted)

    # --- the loop ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """One step of every worker: heartbeat, then finish or die, start; then top the waiting jobs up.

        A deployment's worker heartbeats from a thread of its own, whatever its job does. Here one thread plays every
        worker, so the heartbeats due are written first, then again between any two finishes or starts (each a few
        commands): a tick that finishes and starts many jobs on a slow server never holds the others' beats for
        longer than one of them. A slot changes only once its write went through, so a tick that a database error
        cut short is taken up again by the next one.
        """
        self._openings = None  # the waiting jobs and the busy users, read once a tick, when a worker looks for work
        self._beat_due()
        now = self.clock()
        for index, run in enumerate(self.runs):
            if run is not None and now >= run.ends_at:
                if run.fate is Fate.CRASH:
                    self.doing = "letting a worker die"
                    self._die(run)
                    self.runs[index] = None
                    self.restart_at[index] = now + self.rates.restart_seconds
                    continue
                self.doing = "finishing a job"
                self._finish_all([run], [run.fate])
                self.runs[index] = None  # the worker takes its next job at once
                self._beat_due()
            if self.runs[index] is None and now >= self.restart_at[index]:
                self.doing = "starting a job"
                self.runs[index] = self._start(now)
                self._beat_due()
        self.doing = "topping the waiting jobs up"
        self._top_up()

    def _beat_due(self) -> None:
        """The heartbeats due now, in one command; the workers whose job a cleanup finalized drop it."""
        now = self.clock()
        beating = [run for run in self.runs if run is not None and run.next_beat <= now < run.ends_at]
        if not beating:
            return
        self.doing = "heartbeating the jobs in flight"
        for gone in self._beat(beating, now):  # a cleanup finalized its job (an overrun, say): take another
            self.runs[next(index for index, run in enumerate(self.runs) if run is gone)] = None
            self.counts["finished_by_someone_else"] += 1

    def run(self, seconds: float, stop: Callable[[], bool] = lambda: False, interval: float = 0.5) -> Counter[Any]:
        """Tick for ``seconds`` (or until ``stop()``), then :meth:`stop`; through a database outage, and saying what
        it did every :attr:`report_seconds`."""
        deadline = self.clock() + seconds
        outage_since: float | None = None
        wait = 1.0
        reported, next_report = Counter(self.counts), self.clock() + self.report_seconds
        while self.clock() < deadline and not stop():
            try:
                self.tick()
                if self.claim is not None:
                    self.doing = "renewing the workers' claim on the queue"
                    self.claim.renew()
            except pymongo.errors.PyMongoError as error:
                if not passing(error):
                    raise
                if outage_since is None:
                    outage_since = self.clock()
                    self.say(
                        f"{self.explain(error, self.doing)}; the workers hold {self.held()} jobs and try again, "
                        f"waiting up to {OUTAGE_MAX_WAIT_SECONDS:g} s between attempts"
                    )
                _sleep(min(wait, max(deadline - self.clock(), 0.0)), stop)
                wait = min(wait * 2, OUTAGE_MAX_WAIT_SECONDS)
                continue
            if outage_since is not None:
                self.say(f"the database answers again after {self.clock() - outage_since:.0f} s: the workers go on")
                outage_since, wait = None, 1.0
            if self.clock() >= next_report:
                self.say(self.report(self.counts - reported))
                reported, next_report = Counter(self.counts), self.clock() + self.report_seconds
            _sleep(interval, stop)
        self.stop()
        return self.counts

    def held(self) -> int:
        """The jobs the living workers hold."""
        return sum(1 for run in self.runs if run is not None)

    def report(self, done: Counter[Any]) -> str:
        """One line of what the workers did (``done``: counts since the last line), and what they hold now."""
        return (
            f"{self.now():%H:%M:%S} UTC, the last {_duration(self.report_seconds)}: {_tally(done)}; "
            f"{counted(self.held(), 'job')} in flight on {counted(self.workers, 'worker')}"
        )

    def summary(self) -> str:
        """What the workers did since they started: the deaths that happened, not the crashes planned for the jobs
        they were still running when stopped (those jobs were finished)."""
        return f"{counted(self.counts['adopted'], 'running job')} adopted, {_tally(self.counts)}"

    def stop(self) -> None:
        """Finish the jobs in flight (their workers shut down cleanly, a crash to come included), in a few commands for
        all; the jobs of workers that died stay zombies. Then release the queue's claim. A database out of reach is
        said, after the client's timeout (``$ZOMBIE_MONGO_TIMEOUT_MS``), and the jobs are left as they are."""
        held = [run for run in self.runs if run is not None]
        self.runs = [None] * len(self.runs)
        self.doing = f"finishing the {len(held)} jobs the workers held"
        if held:
            self.say(f"stopping: finishing the {len(held)} jobs the workers hold")
        try:
            for start in range(0, len(held), FINISH_BATCH_SIZE):  # short of their end: as they would have ended
                batch = held[start : start + FINISH_BATCH_SIZE]
                self._finish_all(batch, [Fate.ERROR if run.fate is Fate.ERROR else Fate.SUCCESS for run in batch])
            if self.claim is not None:
                self.claim.release()
        except pymongo.errors.PyMongoError as error:
            if not passing(error):
                raise
            self.say(
                f"{self.explain(error, self.doing)}; the jobs left started look dead after the heartbeat timeout, and "
                "a cleanup finalizes them"
            )

    # --- a job's life, as the deployment lives it ----------------------------------------------------

    def _seconds_run(self, job: JobDocument) -> float:
        return (self.now() - job[Job.STARTED_AT]).total_seconds()

    def _plan(self, job: JobDocument, now: float, already_run: float = 0.0) -> _Run:
        """How ``job`` will end, and when, in clock seconds from ``now``; ``already_run`` seconds are behind it."""
        job_type = self.types.get(job[Job.TYPE], self.job_types[0])
        limit = self.policy.max_duration_of(job[Job.TYPE]) - already_run
        seconds = job_type.median_seconds * math.exp(self.rng.gauss(0.0, job_type.sigma)) * self.rates.speed
        fate = Fate.ERROR if self.rng.random() < job_type.error_rate else Fate.SUCCESS
        if seconds >= limit:
            seconds, fate = limit, Fate.STOPPED_AT_T2
        if self._chance(self.rates.overruns_per_worker_hour, seconds) and self._overrunning() < self._overrun_cap():
            overrun = self.policy.max_duration_of(job[Job.TYPE]) * (self.rng.uniform(*OVERRUN_FACTORS) - 1)
            seconds, fate = limit + overrun, Fate.OVERRUN
        crashes = self.rates.crashes_per_worker_hour
        crash_after = self.rng.expovariate(crashes / 3_600) if crashes else math.inf
        terminated = False
        if crash_after < seconds:
            seconds, fate = crash_after, Fate.CRASH
            terminated = self.generation.declares(Job.TERMINATED_AT) and self.rng.random() < self.rates.terminated_share
        if fate is Fate.OVERRUN:
            self.counts["overrunning"] += 1
        return _Run(job, now + seconds, now + self.rates.heartbeat_seconds, fate, terminated)

    def _chance(self, per_hour: float, seconds: float) -> bool:
        """Whether an event of ``per_hour`` happens within ``seconds`` of work."""
        return self.rng.random() < 1 - math.exp(-per_hour * seconds / 3_600)

    def _overrunning(self) -> int:
        return sum(1 for run in self.runs if run is not None and run.fate is Fate.OVERRUN)

    def _overrun_cap(self) -> int:
        return max(1, math.floor(self.workers * self.rates.max_overrunning_share))

    def _start(self, now: float) -> _Run | None:
        job = self._take_waiting()
        if job is None:
            return None
        run = self._plan(job, now)
        self.counts["started"] += 1  # a crash it may meet is counted when it happens (died), not when planned
        return run

    def _take_waiting(self) -> JobDocument | None:
        """The oldest waiting job whose user runs nothing and whose unicity id is not started, started; None if none."""
        if self._openings is None:
            self._openings = (
                set(self.store.jobs.distinct(Job.NAMESPACE, {Job.STATUS: Status.STARTED})),
                set(self.store.jobs.distinct(Job.UNICITY_ID, {Job.STATUS: Status.STARTED})),
                list(self.store.jobs.find({Job.STATUS: Status.WAITING}).sort(Job.CREATED_AT, 1).limit(200)),
            )
        busy, started_ids, waiting = self._openings
        while waiting:
            candidate = waiting.pop(0)
            if candidate.get(Job.NAMESPACE) in busy or candidate.get(Job.UNICITY_ID) in started_ids:
                continue
            started = self.writes.start(candidate, self.now())
            if started is not None:
                busy.add(started.get(Job.NAMESPACE))
                started_ids.add(started.get(Job.UNICITY_ID))
                return started
        return None

    def _beat(self, runs: list[_Run], now: float) -> list[_Run]:
        """The heartbeat of each of ``runs`` (one command for all: each worker's own write, sent together).

        Returns the runs whose job is no longer started (a cleanup finalized it): their workers drop them.
        """
        if not runs:
            return []
        ids = [run.job[ID] for run in runs]
        written = self.store.jobs.update_many(
            {ID: {"$in": ids}, Job.STATUS: Status.STARTED}, {"$set": {Job.LAST_HEARTBEAT: self.now()}}
        )
        for run in runs:
            run.next_beat = now + self.rates.heartbeat_seconds
        if written.matched_count == len(runs):
            return []
        still = {job[ID] for job in self.store.jobs.find({ID: {"$in": ids}, Job.STATUS: Status.STARTED}, {ID: 1})}
        return [run for run in runs if run.job[ID] not in still]

    def _die(self, run: _Run) -> None:
        """The worker dies: no more heartbeats; after a SIGTERM, the job records it (the deployment's handler)."""
        if run.terminated:
            moment = self.now() - dt.timedelta(seconds=self.rng.uniform(0, min(5.0, self.rates.heartbeat_seconds)))
            self.store.jobs.update_one(
                {ID: run.job[ID], Job.STATUS: Status.STARTED}, {"$set": {Job.TERMINATED_AT: moment}}
            )
            self.counts["terminated"] += 1
        self.counts["died"] += 1
        self.died.append(run.job[ID])

    def _finish_all(self, runs: list[_Run], fates: list[Fate]) -> None:
        """The cache entries first, then the jobs finished as the generation finishes them (those still ours), in a
        few commands for all of ``runs`` (each ending as its ``fates`` says)."""
        current = {job[ID]: job for job in self.store.jobs.find({ID: {"$in": [run.job[ID] for run in runs]}})}
        finished_at = self.now()
        finished: list[tuple[JobDocument, str]] = []
        results: list[ReplaceOne[CacheEntry]] = []
        metrics: Counter[tuple[tuple[str, Any], ...]] = Counter()
        for run, fate in zip(runs, fates):
            job = current.get(run.job[ID])
            if job is None or job.get(Job.STATUS) != Status.STARTED:
                self.counts["finished_by_someone_else"] += 1  # the cleanup took it for a zombie
                continue
            error_code = {Fate.ERROR: WORKER_ERROR_CODE, Fate.STOPPED_AT_T2: ErrorCode.EXCEEDED_MAX_DURATION}.get(fate)
            key, entry, previous = self._result(job, finished_at, error_code)
            results.append(ReplaceOne(key, entry, upsert=True))
            for old_or_new, change in ((previous, -1), (entry, +1)):
                if old_or_new is not None:
                    metrics[self._cache_metric_key(old_or_new)] += change
            finished.append((job, Status.SUCCESS if error_code is None else Status.ERROR))
            if fate is Fate.STOPPED_AT_T2:
                self.counts["stopped_at_max_duration"] += 1
        if not finished:
            return
        self.store.cache.bulk_write(results, ordered=False)
        if self.generation.cache_metrics and any(metrics.values()):
            self.store.cache_metrics.bulk_write(
                [
                    UpdateOne(dict(key), {"$inc": {CacheMetric.TOTAL: change}}, upsert=True)
                    for key, change in metrics.items()
                    if change
                ],
                ordered=False,
            )
        self.writes.finish(finished, finished_at)
        self.counts.update(f"finished_{status}" for _, status in finished)

    def _result(
        self, job: JobDocument, finished_at: dt.datetime, error_code: str | None
    ) -> tuple[dict[str, Any], CacheEntry, CacheEntry | None]:
        """The cache entry a job writes as it ends, with its key and the entry it replaces."""
        key = cache_key_of_job(job)
        previous = self.store.cache.find_one(key, {Cache.CONTENT: 0})
        failed = error_code is not None
        rule = self.generation.failed_runs
        if failed:
            failed_runs = failed_runs_after_crash(previous, job, rule)
        else:  # a success set the count to 0 until 2026-05 (orchestrator.finish_job); since, it keeps it
            failed_runs = 0 if rule is FailedRunsRule.SAME_REVISION_ELSE_ZERO else stored_failed_runs(previous)
        entry = {
            **key,
            Cache.HTTP_STATUS: DEFAULT_ZOMBIE_HTTP_STATUS if failed else HTTP_OK,
            Cache.ERROR_CODE: error_code,
            Cache.CONTENT: {CACHE_CONTENT_ERROR: "simulated failure"}
            if failed
            else {"rows": self.rng.randrange(1_000)},
            Cache.DETAILS: {CACHE_CONTENT_ERROR: "simulated failure"} if failed else {},
            Cache.WORKER_VERSION: "2.0.0",
            Cache.JOB_RUNNER_VERSION: 2,
            Cache.DATASET_GIT_REVISION: job.get(Job.REVISION, "main"),
            Cache.PROGRESS: 1.0,
            Cache.UPDATED_AT: finished_at,
            Cache.DURATION: round((finished_at - job[Job.STARTED_AT]).total_seconds(), 3),
            Cache.FAILED_RUNS: failed_runs,
        }
        return key, self.cache_generation.keep_declared(entry), previous

    @staticmethod
    def _cache_metric_key(entry: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The ``cacheTotalMetric`` counter an entry counts in (a tuple of its fields, to sum changes by)."""
        return (
            (CacheMetric.KIND, entry[Cache.KIND]),
            (CacheMetric.HTTP_STATUS, entry[Cache.HTTP_STATUS]),
            (CacheMetric.ERROR_CODE, entry.get(Cache.ERROR_CODE)),
        )

    def _top_up(self) -> None:
        target = self.rates.waiting_target if self.rates.waiting_target is not None else max(MIN_WAITING, self.workers)
        missing = target - self.store.jobs.count_documents({Job.STATUS: Status.WAITING})
        if missing <= 0:
            return
        new_jobs = []
        for _ in range(missing):
            job_type = self.rng.choice(self.job_types)
            dataset = f"user{self.rng.randrange(USERS)}/dataset-{self.rng.randrange(2_000)}"
            config = None if job_type.level == "dataset" else self.rng.choice(["default", "en"])
            split = None if job_type.level != "split" else self.rng.choice(["train", "test"])
            new_jobs.append(
                job_document(
                    job_type.name,
                    dataset,
                    config,
                    split,
                    status=Status.WAITING,
                    generation=self.generation,
                    difficulty=job_type.difficulty,
                    created_at=self.now(),
                )
            )
        self.store.jobs.insert_many(new_jobs)
        self.writes.insert(new_jobs)
        self.counts["enqueued"] += len(new_jobs)
