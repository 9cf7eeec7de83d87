"""The watcher: every dead job released at its deadline, not a poll and a run's start later.

Over 500 lines: one loop and its steps in the order they run; its lease is apart already (``watch_lease.py``).

A started job's deadline is known from the job as read, by the rules detection judges it by
(:func:`detection.rules_of`): its last heartbeat (else its start) + the heartbeat timeout, its SIGTERM's grace, its
start + its T2. A :class:`Watch` keeps the deadline of every started job, read again every ``refresh_seconds`` by
one query on the ``(status, started_at)`` index, sleeps until the earliest, then acts as a cleanup acts, with its
steps:

1. ``detection.detect`` re-reads what is due, by the same query and rules, at that moment: a job that beat since is
   no longer due;
2. the brake weighs it as :func:`run.find` does (below);
3. ``causes.judged`` tells each one's cause, with the deaths finalized recently;
4. :func:`run.claim_and_finalize` claims each one in the audit trail and finalizes it through the ``Finalizer``: the
   queue generation's finish by compare-and-set, in batches, exactly once beside any other cleanup and the
   deployment's own killer.

What falls due together is judged together. A pass comes at the deadline it serves, up to ``pass_burst`` of them at
once; past that, one every ``min_pass_seconds``, each taking everything due by then as one batch: a lone death waits
for nothing, a wave costs a pass a second. The brake counts, beside what is due, the jobs finalized in the last
*window* (the policy's ``wave_window_seconds``, at most half the heartbeat timeout) as stale and as started: what
:func:`run.find` would have seen had they not been finalized yet. And when the deadlines due within the next window
would engage the brake, the pass waits for them, one window at most: a fleet going quiet at once is refused as a
whole, not released one deadline at a time until half of it is gone; the jobs among them that beat meanwhile drop
out. A wave of deaths (``causes``) is not waited for: its members are judged as they fall due, the finalized ones
counting for the next (from its tenth death on, a deploy), as a cleanup whose tick splits a wave judges it.

The watch keeps what a cleanup's first step keeps too: every ``reconcile_seconds`` it takes over what dead runs left
half done and enqueues the retries that are due (:func:`run.reconcile`). Compensations and the audit of late results
stay with ``kill_zombies_job``.

One watch acts at a time (``watch_lease``): it takes the lease before acting, renews it between passes, and lets it
go at its end, so that a successor waiting for it takes over within ``refresh_seconds``. A database that stops
answering is waited out, said once when it goes and once when it comes back; a pass it cut short is completed from
what the database holds (:func:`run.resume`).

Listeners (:class:`Listener`) are handed each refresh's started jobs as read, where every heartbeat shows, and are
flushed every ``flush_seconds`` and at the end. Time comes from ``clock`` and passes in ``sleep``: a test drives a
watch through minutes in a moment.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from pymongo.errors import ConnectionFailure, PyMongoError

from zombie_pipeline.cleanup import causes, run, watch_lease
from zombie_pipeline.cleanup.brake import Brake
from zombie_pipeline.cleanup.detection import (
    Candidate,
    Rule,
    count_started,
    detect,
    rules_of,
    started_filter,
)
from zombie_pipeline.cleanup.results import StepResult
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, WatchLease, WatchState
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, JobSnapshot, job_type_problem
from zombie_pipeline.queue.store import READ_BATCH, Store
from zombie_pipeline.queue.times import as_utc, utc_now

#: What a refresh reads of each started job: what its rules read, and what a listener needs (its type and worker size).
WATCHED_FIELDS = (Job.TYPE, Job.DATASET, Job.DIFFICULTY, Job.STARTED_AT, Job.LAST_HEARTBEAT, Job.TERMINATED_AT)
#: A deadline is past once the clock is beyond it: the watch wakes this much after it.
TICK = dt.timedelta(milliseconds=1)
TURNED_OFF = "the policy turns the watcher off (watch_deadlines: false)"


class Listener(Protocol):
    """Told what every refresh read: the heartbeats of the started jobs, seen every ``refresh_seconds``."""

    def observe(self, jobs: Sequence[Mapping[str, Any]], now: dt.datetime) -> None:
        """The started jobs as read at ``now``: ``_id``, ``type``, ``dataset``, ``started_at`` and, where present,
        ``difficulty``, ``last_heartbeat``, ``terminated_at``."""

    def flush(self, store: Store, now: dt.datetime) -> None:
        """Record what was observed; called every ``flush_seconds`` and when the watch ends."""


class Log(Protocol):
    """Where a watch says what it does: Dagster's run log, or a ``logging.Logger``."""

    def info(self, msg: str) -> Any: ...
    def warning(self, msg: str) -> Any: ...
    def error(self, msg: str) -> Any: ...


class _Quiet:
    def info(self, msg: str) -> None:
        pass

    warning = error = info


@dataclass(frozen=True)
class WatchSettings:
    """How often a watch does what (seconds)."""

    run_seconds: float = 3600.0  # from taking the lease to handing it over
    refresh_seconds: float = 2.0  # the started jobs read again
    min_pass_seconds: float = 1.0  # once a burst of passes is spent, one pass per this: what falls due waits for it
    pass_burst: int = 5  # passes that may come at their deadlines one right after another
    lease_seconds: float = 15.0  # a watch not heard of for this long is dead (or hung): the fallback takes over
    renew_seconds: float = 5.0
    reconcile_seconds: float = 60.0  # dead runs' half-done finalizations taken over, due retries enqueued
    policy_seconds: float = 60.0  # the policy in force read again (suggested maximum durations, where opted in)
    flush_seconds: float = 60.0  # the listeners record what they observed
    brake_recheck_seconds: float = 10.0  # while the brake refuses, it is judged again this often
    outage_max_wait_seconds: float = 5.0  # a database that does not answer is tried again 1 s later, then up to this
    max_lease_wait_seconds: float = 900.0  # a watch that finds the lease held waits this long for it, then ends


@dataclass(frozen=True)
class Watched:
    """A started job as the last refresh read it, and the rule that makes it a zombie first."""

    job: JobSnapshot
    rule: Rule

    @property
    def due_at(self) -> dt.datetime:
        return self.rule.due_at


@dataclass
class PassBudget:
    """Passes at the deadlines they serve while the budget lasts, ``burst`` at most, refilled one per ``seconds``: a
    lone death is released at its deadline, a wave of them costs one pass a second, not one per death."""

    burst: int
    seconds: float
    tokens: float = field(init=False)
    spent_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def next_at(self) -> dt.datetime | None:
        """When the next pass may come; None: now."""
        if self.spent_at is None or self.tokens >= 1:
            return None
        return self.spent_at + dt.timedelta(seconds=(1 - self.tokens) * self.seconds)

    def spend(self, now: dt.datetime) -> None:
        if self.spent_at is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.spent_at).total_seconds() / self.seconds)
        self.spent_at = now
        self.tokens -= 1


@dataclass
class WatchReport:
    """What a watch did, for its run's metadata."""

    run_id: str
    result: StepResult = field(default_factory=StepResult)  # the finalizations' counts and rows, as a cleanup's
    release_lags: list[float] = field(default_factory=list)  # of its finalizations, seconds
    acquired_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    ended_because: str = ""
    refreshes: int = 0
    passes: int = 0
    holds: int = 0  # deadlines held to be judged with the ones falling due after them
    brake_refusals: int = 0
    outages: int = 0
    outage_seconds: float = 0.0


def passing(error: PyMongoError) -> bool:
    """Whether waiting may help: a connection lost or refused, a server not chosen, an answer that did not come in
    time. A command the server refused would be refused again."""
    return isinstance(error, ConnectionFailure) or error.timeout


class Watch:
    """One watch run's loop: takes the lease, keeps the deadlines, acts at each, hands over."""

    def __init__(
        self,
        store: Store,
        policy: Callable[[], ZombiePolicy],
        run_id: str,
        settings: WatchSettings = WatchSettings(),
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
        listeners: Sequence[Listener] = (),
        log: Log | None = None,
        on_brake: Callable[[Brake], None] | None = None,
    ) -> None:
        self.store = store
        self.policy_of = policy
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.listeners = list(listeners)
        self.log: Log = log or _Quiet()
        self.on_brake = on_brake
        self.report = WatchReport(run_id)
        self.watched: dict[Any, Watched] = {}
        self.acted_until = dt.datetime.min.replace(tzinfo=dt.UTC)  # deadlines before this were judged by a pass
        self.ends_at = dt.datetime.max.replace(tzinfo=dt.UTC)
        self.hold_since: dt.datetime | None = None
        self.hold_until: dt.datetime | None = None
        self.braked: Brake | None = None
        self.brake_recheck_at: dt.datetime | None = None
        self.passes = PassBudget(settings.pass_burst, settings.min_pass_seconds)
        self.unfinished = False  # a pass was cut short: its claims are completed before anything else
        self.outage_since: dt.datetime | None = None
        self.answered = False  # the database answered in this step
        self.listener_errors: set[int] = set()
        self.next: dict[str, dt.datetime] = {}

    # --- the loop ---------------------------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool] = lambda: False) -> WatchReport:
        """Watch until the run's time is up, ``stop`` says so, the policy turns the watcher off or another watch took
        the lease; the lease is let go and the listeners flushed whichever it is."""
        self.policy = self.policy_of()
        if not self.policy.watch_deadlines:
            return self._ended(TURNED_OFF)
        self.plan = self._when_answering(lambda: run.prepare(self.store, self.policy, self.report.run_id).plan, stop)
        if self.plan is None or not self._take_lease(stop):
            return self._ended(self.report.ended_because or "stopped before it took the lease")
        try:
            while not stop():
                now = self.clock()
                if now >= self.ends_at:
                    return self._ended(f"its {self.settings.run_seconds:.0f} s are over: a successor takes over")
                self.answered = False
                try:
                    ended = self._step(now)
                except PyMongoError as error:
                    if not passing(error):
                        raise
                    self._outage(error)
                    continue
                if self.answered:
                    self._answering()
                if ended:
                    return self._ended(ended)
                self.sleep(max((self._wake() - self.clock()).total_seconds(), 0.0))
            return self._ended("told to stop")
        finally:
            self._let_go()

    def _step(self, now: dt.datetime) -> str | None:
        """Whatever is due at ``now``; why the watch ends, if it does. A task the database cut short is tried again at
        the next step: it is due until it is done."""
        if self._due("policy", now):
            self.policy = self.policy_of()
            self.plan = replace(self.plan, policy=self.policy)
            self._done("policy", now)
            if not self.policy.watch_deadlines:
                return TURNED_OFF
        if self._due("renew", now):
            if not self._renew(now):
                return "another watch run took the lease over (this one was not heard of in time)"
            self._done("renew", now)
        if self.unfinished:
            self.report.result.merge(self._finalized(run.resume(self.store, self.plan)))
            self.unfinished = False
        if self._due("reconcile", now):
            self.report.result.merge(self._finalized(run.reconcile(self.store, self.plan, now)))
            self._done("reconcile", now)
        if self._due("refresh", now):
            self._refresh(now)
            self._done("refresh", now)
        if self._due("flush", now):
            self._flush(now)
            self._done("flush", now)
        if self._pass_due(now):
            self._pass(now)
        return None

    def _due(self, what: str, now: dt.datetime) -> bool:
        """Whether the recurring task ``what`` is due at ``now`` (each is, until it is first done)."""
        return now >= self.next.get(what, now)

    def _done(self, what: str, now: dt.datetime) -> None:
        self.next[what] = now + dt.timedelta(seconds=getattr(self.settings, f"{what}_seconds"))
        self.answered = True

    def _wake(self) -> dt.datetime:
        """When something is next due: a recurring task, a deadline (no sooner than the next pass may come), the end."""
        moments = [*self.next.values(), self.ends_at]
        deadline = self._earliest()
        if deadline is not None:
            moments.append(max([deadline + TICK, *self._pass_gates()]))
        return min(moments)

    def _pass_gates(self) -> list[dt.datetime]:
        gates = [moment for moment in (self.hold_until, self.brake_recheck_at) if moment is not None]
        if (paced := self.passes.next_at()) is not None:
            gates.append(paced)
        return gates

    def _earliest(self) -> dt.datetime | None:
        """The earliest deadline no pass has judged yet."""
        pending = [watched.due_at for watched in self.watched.values() if watched.due_at >= self.acted_until]
        return min(pending, default=None)

    def _pass_due(self, now: dt.datetime) -> bool:
        deadline = self._earliest()
        return deadline is not None and deadline < now and all(gate <= now for gate in self._pass_gates())

    # --- what a refresh reads -------------------------------------------------------------------------------

    def _refresh(self, now: dt.datetime) -> None:
        """The started jobs read again, each with its deadline; the listeners told what was read."""
        projection = {"$project": dict.fromkeys(WATCHED_FIELDS, 1)}
        jobs = list(self.store.jobs.aggregate(on_index(started_filter(), {}, projection), batchSize=READ_BATCH))
        self.report.refreshes += 1
        watched = {}
        for job in jobs:
            if _judgeable(job):  # a malformed one is left to a cleanup's find, which reports it
                watched[job[ID]] = Watched(job, min(rules_of(job, self.policy), key=lambda rule: rule.due_at))
        self.watched = watched
        for listener in self.listeners:
            self._tell(listener, partial(listener.observe, jobs, now))

    def _flush(self, now: dt.datetime) -> None:
        for listener in self.listeners:
            self._tell(listener, partial(listener.flush, self.store, now))

    def _tell(self, listener: Listener, call: Callable[[], None]) -> None:
        """A listener that fails is said once, and told again next time: the watch goes on."""
        try:
            call()
        except Exception as error:  # a listener's bug must never stop the releases
            if id(listener) not in self.listener_errors:
                self.listener_errors.add(id(listener))
                self.log.warning(f"listener {type(listener).__name__} failed ({error!r}); the watch goes on")

    # --- a pass ------------------------------------------------------------------------------------------------

    def _pass(self, now: dt.datetime) -> None:
        """What is due at ``now``, re-read, weighed by the brake, held with what falls due after it, or finalized."""
        policy = self.policy
        due = detect(self.store.jobs, policy, now).candidates
        self.answered = True
        self.passes.spend(now)
        self.report.passes += 1
        if not due:
            self.acted_until = now
            self._released(None)
            return
        window = window_seconds(policy)
        recent = self.store.events.count_documents({Event.FINALIZED_AT: {"$gte": now - dt.timedelta(seconds=window)}})
        started = count_started(self.store.jobs)
        brake = Brake.of(policy, stale=len(due) + recent, started=started + recent)
        if brake.engaged:
            self._refuse(brake, now)
            return
        held = self._hold(due, now, window, recent, started)
        if held:
            return
        self._released(brake)
        candidates = causes.judged(due, self.store.events, policy, now)
        self.unfinished = True
        stamp = None if self.clock is utc_now else self.clock()  # a test's clock stamps the writes too
        result = run.claim_and_finalize(self.store, self.plan, candidates, stamp)
        self.unfinished = False
        self.acted_until = now
        self.report.result.merge(self._finalized(result))
        for candidate in candidates:
            self.watched.pop(candidate.id, None)

    def _hold(self, due: list[Candidate], now: dt.datetime, window: float, recent: int, started: int) -> bool:
        """Whether the jobs due now wait for the ones falling due within the window after them (one window at most):
        with them, the brake would engage."""
        if self.hold_since is not None and now >= self.hold_since + dt.timedelta(seconds=window):
            self.hold_since = self.hold_until = None
            return False
        ids = {candidate.id for candidate in due}
        horizon = now + dt.timedelta(seconds=window)
        soon = [item for item in self.watched.values() if now <= item.due_at <= horizon and item.job[ID] not in ids]
        why = self._forecast(due, soon, recent, started)
        if why is None:
            self.hold_since = self.hold_until = None
            return False
        if self.hold_since is None:
            self.hold_since = now
            self.report.holds += 1
            self.log.info(
                f"{len(due)} jobs due, held up to {window:.0f} s for {len(soon)} falling due after them: {why}"
            )
            self._renew(now, WatchState.HOLDING)
        self.hold_until = min(self.hold_since + dt.timedelta(seconds=window), max(item.due_at for item in soon) + TICK)
        return True

    def _forecast(self, due: list[Candidate], soon: list[Watched], recent: int, started: int) -> str | None:
        """Why the jobs due now should wait for ``soon``: with them, the brake would engage; else None.

        Only the brake: which of the silent jobs are dead is not known before their deadlines, and slow workers (beats
        up to 0.7 of the timeout apart, alive) fill every window's look-ahead. Holding for a wave of deaths on that
        forecast held ordinary deaths half a minute on the production stack; the brake's forecast needs half the fleet.
        """
        if not soon:
            return None
        forecast = Brake.of(self.policy, stale=len(due) + len(soon) + recent, started=started + recent)
        if forecast.engaged:
            return f"with them, {forecast.stale} of {forecast.started} started jobs would look dead (the brake)"
        return None

    def _refuse(self, brake: Brake, now: dt.datetime) -> None:
        """The brake refuses what is due: said once, weighed again every ``brake_recheck_seconds``."""
        self.report.brake_refusals += 1
        self.brake_recheck_at = now + dt.timedelta(seconds=self.settings.brake_recheck_seconds)
        self.hold_since = self.hold_until = None
        if self.braked is None:
            self.log.error(
                brake.message()
                + " The watcher keeps watching and weighs them again every "
                + f"{self.settings.brake_recheck_seconds:.0f} s; what falls due meanwhile waits with them."
            )
            if self.on_brake is not None:
                self.on_brake(brake)
        self.braked = brake
        self._renew(now, WatchState.BRAKED)

    def _released(self, brake: Brake | None) -> None:
        """The brake no longer refuses (fewer jobs look dead, or none is due): said once."""
        if self.braked is None:
            return
        looks = f"{brake.stale} of {brake.started} started jobs look dead" if brake else "no job is due any more"
        self.log.info(f"the brake no longer holds: {looks}")
        self.braked = None
        self.brake_recheck_at = None
        if self.on_brake is not None and brake is not None:
            self.on_brake(brake)

    def _finalized(self, result: StepResult) -> StepResult:
        """A pass's (or a reconcile's) finalizations, each said in the log with how late it came."""
        for row in result.rows:
            lag = row.get("release_lag_seconds")
            if isinstance(lag, (int, float)):
                self.report.release_lags.append(float(lag))
            self.log.info(
                f"released {row.get('type')} {row.get('dataset')} ({row.get('reason')}, {row.get('cause')}): "
                f"{_seconds(lag)} after its deadline, {_seconds(row.get('detection_seconds'))} after its last sign "
                "of life"
            )
        return result

    # --- the lease, and a database that does not answer --------------------------------------------------------

    def _take_lease(self, stop: Callable[[], bool]) -> bool:
        """Wait for the lease (another watch may hold it until its end): whether this watch has it."""
        start = self.clock()
        said = False
        while not stop():
            now = self.clock()
            ends_at = now + dt.timedelta(seconds=self.settings.run_seconds)
            lease = self.store.watchers, self.report.run_id, now, self.settings.lease_seconds, ends_at
            acquired = self._when_answering(partial(watch_lease.acquire, *lease), stop)
            if acquired:
                self.ends_at, self.report.acquired_at = ends_at, now
                later = {"policy", "renew", "flush"}  # just read, taken, and nothing observed yet
                self.next = {
                    what: now + dt.timedelta(seconds=getattr(self.settings, f"{what}_seconds")) for what in later
                }
                self.log.info(f"watching the queue's deadlines until {ends_at:%H:%M:%S} UTC")
                return True
            if acquired is None:
                return False
            if (now - start).total_seconds() >= self.settings.max_lease_wait_seconds:
                self.report.ended_because = "another watch run kept the lease"
                return False
            if not said:
                holder = watch_lease.read(self.store.watchers)
                self.log.info(f"waiting for the lease: {holder.describe(now) if holder else 'held'}")
                said = True
            self.sleep(self.settings.refresh_seconds)
        return False

    def _renew(self, now: dt.datetime, state: WatchState | None = None) -> bool:
        if state is None:
            state = WatchState.BRAKED if self.braked else WatchState.HOLDING if self.hold_since else WatchState.WATCHING
        facts = {
            WatchLease.WATCHED: len(self.watched),
            WatchLease.NEXT_DEADLINE: self._earliest(),
            WatchLease.FINALIZED: len(self.report.result.rows),
        }
        return watch_lease.renew(
            self.store.watchers, self.report.run_id, now, self.settings.lease_seconds, state, **facts
        )

    def _let_go(self) -> None:
        """The lease let go and the listeners flushed, as far as the database lets it: a successor takes over."""
        now = self.clock()
        self._flush(now)
        try:
            facts = {WatchLease.FINALIZED: len(self.report.result.rows)}
            watch_lease.release(self.store.watchers, self.report.run_id, now, **facts)
        except PyMongoError as error:
            self.log.warning(f"the lease could not be let go ({error}); it lapses by itself")

    def _when_answering(self, call: Callable[[], Any], stop: Callable[[], bool]) -> Any:
        """``call`` once the database answers (None if told to stop first)."""
        while not stop():
            try:
                answer = call()
            except PyMongoError as error:
                if not passing(error):
                    raise
                self._outage(error)
                continue
            self._answering()
            return answer
        return None

    def _outage(self, error: PyMongoError) -> None:
        """Said once; tried again 1 s later, then twice as long each time, up to ``outage_max_wait_seconds``."""
        now = self.clock()
        if self.outage_since is None:
            self.outage_since = now
            self.report.outages += 1
            self.log.warning(
                f"the database does not answer ({type(error).__name__}: {str(error)[:200]}); waiting for it: "
                "deadlines that pass meanwhile are acted on once it answers"
            )
        waited = (now - self.outage_since).total_seconds()
        self.sleep(min(max(1.0, waited), self.settings.outage_max_wait_seconds))

    def _answering(self) -> None:
        if self.outage_since is None:
            return
        seconds = (self.clock() - self.outage_since).total_seconds()
        self.report.outage_seconds += seconds
        self.log.info(f"the database answers again after {seconds:.1f} s")
        self.outage_since = None
        self.unfinished = True  # a pass it cut short left claims: completed first

    def _ended(self, because: str) -> WatchReport:
        self.report.ended_because = because
        self.report.ended_at = self.clock()
        self.log.info(f"watch ends: {because}")
        return self.report


def window_seconds(policy: ZombiePolicy) -> float:
    """How far ahead a pass looks for what falls due with it: the span of a wave's last beats, at most half the
    heartbeat timeout (a live job's deadline is never further than the timeout away)."""
    return float(min(policy.wave_window_seconds, policy.heartbeat_timeout_seconds / 2))


def _judgeable(job: Mapping[str, Any]) -> bool:
    """Whether the rules can read the job: a type that is one, a start that is a date, the other dates dates or null."""
    dates = [job.get(name) for name in (Job.LAST_HEARTBEAT, Job.TERMINATED_AT)]
    return (
        job_type_problem(job.get(Job.TYPE)) is None
        and as_utc(job.get(Job.STARTED_AT)) is not None
        and all(value is None or as_utc(value) is not None for value in dates)
    )


def _seconds(value: Any) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "?"
