"""From claimed to done, a batch of zombies at a time, exactly once, never over a live worker: one object per pass.

A :class:`Finalizer` is built once per run and queue generation, with the
collaborators it drives: the run's side of the audit trail (:mod:`.events`),
the generation's finish (:mod:`.strategies`), the cache's error entries
(:mod:`.cache_errors`), the deployment's bookkeeping around a finish
(:mod:`.effects`), the counters' repair (:mod:`.counters`), the retries
(:mod:`.retries`) and the compensations in force. A batch's pass, each part safe
to redo, reads top to bottom in :meth:`Finalizer.drive_batch`:

1. the claims are sorted by the finish strategy (still as detection saw them,
   finished by an earlier pass, or lost to a worker that moved);
2. the jobs are finished (compare-and-set), with what the deployment does around
   a finish, and their cache error entries written, in the order the strategy
   gives, each in a transaction where the policy asks for them and the server
   has them; just before the entries, the quarantine judges them (a crash may
   begin one: written first, so a redone pass finds it);
3. the counters an earlier pass may have moved are set from a recount;
4. the retries where the generation and the cause want them, then each event
   is completed once, with every outcome; claims lost to a live worker are
   forgotten, so the job may be judged again later.

A zombie costs its claim, its job, its cache entry and that one completion (and
its retry). A pass that dies leaves its events claimed: the next run takes them
over (:meth:`EventLog.take_over_expired`) and redoes the pass. A pass whose
write the server applied but whose reply was lost fails its step, and the step's
retry in the same run finds the events still claimed, under its own lease.
Either way the pass is redone from what the database holds, never from what a
process heard: it recognizes what was done (the strategy's proof of its finish,
our entry in the cache, the retry's ``_id`` chosen at claim time) and never does
it twice; only the events claimed by the same call are known untouched.

The deployment's counters are moved with ``$inc``, which cannot be recognized
afterwards: of a write found done, nobody knows whether the earlier pass also
moved its counters. Within a transaction it did (they commit together).
Without, those counters are in doubt (``counters.CountersInDoubt``), and the
pass sets them to a recount of their keys (``counters.repair``) before it
completes the events, so that a pass dying there leaves them in doubt for the
next one. The events record every effect either way, ``job_metrics`` included:
once the pass ends, the counters are in step.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from bson import ObjectId
from pymongo.client_session import ClientSession

from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.cache_errors import CacheErrors, CacheWrite
from zombie_pipeline.cleanup.compensations import Compensation, pending_for
from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.cleanup.effects import AppliedEffects, DeploymentEffects, Finished
from zombie_pipeline.cleanup.events import Claims, EventLog
from zombie_pipeline.cleanup.quarantine import Quarantines
from zombie_pipeline.cleanup.results import StepResult, batch_result, cache_generation_count
from zombie_pipeline.cleanup.retries import Retries
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.cleanup.strategies import FinishOutcome, FinishStrategy, SortedClaims, strategy_for
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, ZombieEvent
from zombie_pipeline.queue.generations import CacheGeneration, QueueGeneration
from zombie_pipeline.queue.jobs import ID, Job
from zombie_pipeline.queue.reasons import WORKER_GONE
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.queue.transactions import atomically, in_transactions


@dataclass(frozen=True)
class Finalizer:
    """A run's finalization of the zombies of one queue generation: built once, driven a batch at a time."""

    store: Store
    log: EventLog
    strategy: FinishStrategy
    cache_errors: CacheErrors
    effects: DeploymentEffects
    retries: Retries
    quarantines: Quarantines
    actions: tuple[Compensation, ...]
    transactions: bool
    #: Where the pass's stamps come from (its finalization time, its completion): now, unless a replay says otherwise.
    clock: Callable[[], dt.datetime] = utc_now

    @classmethod
    def build(
        cls,
        store: Store,
        run_id: str,
        policy: ZombiePolicy,
        generation: QueueGeneration,
        cache: CacheGeneration,
        actions: tuple[Compensation, ...],
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> Finalizer:
        """The finalizer of ``generation``'s claims, with the deployment's collections that generation keeps."""
        strategy = strategy_for(store, generation)
        effects = DeploymentEffects(store, SideCollections.of(store, generation))
        return cls(
            store=store,
            log=EventLog(store.events, run_id, policy),
            strategy=strategy,
            cache_errors=CacheErrors(
                store,
                cache,
                policy.http_status,
                effects.side.cache_metrics,
                policy.costless_causes,
                generation.failed_runs,
            ),
            effects=effects,
            retries=Retries(store, policy, effects, strategy.enqueues_retries(policy)),
            quarantines=Quarantines(store, policy),
            actions=actions,
            transactions=policy.transactions,
            clock=clock,
        )

    def claim(self, candidates: Sequence[Candidate], now: dt.datetime) -> Claims:
        """Claim each candidate in the audit trail (its event, stamped with this pass's finalization time)."""
        return self.log.claim(candidates, now, self.strategy.generation, finalized_at=self.clock())

    def finalize(self, fresh: Collection[Any] = frozenset()) -> StepResult:
        """Drive this run's claimed events of the generation to done, a batch at a time.

        ``fresh``: the events just claimed, untouched since. Any other claimed event of the run may have been
        partly done by an earlier pass whose reply was lost (a step retried in the same run) or that died (a run
        taken over), and is judged from what the database holds, never from what this process remembers.
        """
        result = StepResult()
        claimed = {Event.STATE: EventState.CLAIMED, Event.QUEUE_GENERATION: self.strategy.generation.name}
        for events in self.log.drain(claimed):
            result.counts[cache_generation_count(self.cache_errors.generation.name)] = 1
            result.merge(self.drive_batch(events, fresh))
        return result

    def drive_batch(self, events: list[ZombieEvent], fresh: Collection[Any]) -> StepResult:
        """One batch from claimed to done; each part is safe to redo, the events are written once, at the end."""
        queue, cache = self.store.jobs.database.client, self.store.cache.database.client
        claims = self.strategy.sort_claims(events, fresh)
        if self.strategy.writes_error_entry_first:
            entries = claims.to_finish + claims.done_before
            quarantined = self.quarantines.judge(entries)
            write = partial(self.cache_errors.write, entries, quarantined=quarantined)
            cached = atomically(cache, write, self.transactions)
            outcome, effects = atomically(queue, partial(self._finish, claims), self.transactions)
        else:
            outcome, effects = atomically(queue, partial(self._finish, claims), self.transactions)
            quarantined = self.quarantines.judge(outcome.finished)
            write = partial(self.cache_errors.write, outcome.finished, quarantined=quarantined)
            cached = atomically(cache, write, self.transactions)
        in_doubt = CountersInDoubt()  # in a transaction, a write and its counters commit together: none in doubt
        if not in_transactions(queue, self.transactions):
            in_doubt.merge(effects.in_doubt)
        if not in_transactions(cache, self.transactions):
            in_doubt.merge(cached.in_doubt)
        complete = partial(self._retry_and_complete, outcome, effects, cached, in_doubt, frozenset(quarantined))
        return atomically(queue, complete, self.transactions)

    def _finish(self, claims: SortedClaims, session: ClientSession | None) -> tuple[FinishOutcome, AppliedEffects]:
        """The jobs finished as the generation does, then what the deployment does around each finish."""
        outcome = self.strategy.finish(claims, session)
        now = self.clock()
        finished_now = self.effects.after_finish(_finished(outcome.won), now, session)
        finished_before = self.effects.after_finish(_finished(outcome.done_before), now, session, counted=False)
        return outcome, finished_now.merge(finished_before)

    def _retry_and_complete(
        self,
        outcome: FinishOutcome,
        effects: AppliedEffects,
        cached: CacheWrite,
        in_doubt: CountersInDoubt,
        quarantined: frozenset[Any],
        session: ClientSession | None,
    ) -> StepResult:
        """The retries, the counters in doubt set from a recount, then every event's outcome recorded at once."""
        now = self.clock()
        finished: list[ZombieEvent] = [{**event, **cached[event[ID]]} for event in outcome.finished]
        retried = self.retries.enqueue(finished, now, session, quarantined)
        if session is None:  # retries an earlier pass inserted may or may not have had their counters moved
            in_doubt = CountersInDoubt().merge(in_doubt).merge(retried.in_doubt)
        # Set from a recount before the events are completed, so that a pass dying here leaves them in doubt for the
        # next. Never in the queue's transaction: within one, only the cache's counters (another database) can be.
        repaired = counters.repair(self.store, self.effects.side, in_doubt)
        done: dict[ObjectId, ZombieEvent] = {
            event[ID]: {
                Event.STATE: EventState.DONE,
                **cached[event[ID]],
                Event.EFFECTS: effects.by_job[event[ID]],
                Event.RETRY_OUTCOME: retried.outcomes[event[ID]][0],
                **({Event.RETRY_DUE_AT: due_at} if (due_at := retried.outcomes[event[ID]][1]) else {}),
                **pending_for(self.actions, event[Event.JOB][Job.TYPE]),
                Event.COMPLETED_AT: now,
            }
            for event in finished
        }
        self.log.complete(done, forgotten=[event[ID] for event in outcome.lost], session=session)
        return batch_result(
            outcome.finished, len(outcome.lost), effects.by_job, cached.outcomes, retried.outcomes, repaired
        )


def _finished(events: list[ZombieEvent]) -> list[Finished]:
    return [
        Finished(event[Event.JOB], event[Event.FINALIZED_AT], worker_gone=event[Event.REASON] in WORKER_GONE)
        for event in events
    ]
