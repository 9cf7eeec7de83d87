"""From claimed to done, a batch of zombies at a time, exactly once, never over a live worker.

A batch's pass, each part safe to redo:

1. the claims are sorted by the queue's finish strategy (still as detection saw
   them, finished by an earlier pass, or lost to a worker that moved);
2. the jobs are finished (compare-and-set) and their cache error entries written
   (:mod:`.cache_errors`), in the order the generation writes them, each in a
   transaction where the policy asks for them and the server has them; around the
   finish, what the deployment does (:mod:`.effects`);
3. the retries where the generation wants them (:mod:`.retries`), then each
   event is completed once, with every outcome; claims lost to a live worker are
   forgotten, so the job may be judged again later.

A zombie costs its claim, its job, its cache entry and that one completion (and
its retry). A pass that dies leaves its events claimed: the next run's
:func:`reconcile` takes them over and redoes the pass. A pass whose write the
server applied but whose reply was lost fails its step, and the step's retry in
the same run finds the events still claimed, under its own lease. Either way
the pass is redone from what the database holds, never from what a process
heard: it recognizes what was done (the strategy's proof of its finish, our
entry in the cache, the retry's ``_id`` chosen at claim time) and never does it
twice; only the events claimed by the same call are known untouched.

The deployment's counters are moved with ``$inc``, which cannot be recognized
afterwards: of a write found done, nobody knows whether the earlier pass also
moved its counters. Within a transaction it did (they commit together).
Without, those counters are in doubt (``effects.CountersInDoubt``), and the
pass that takes over sets them to a recount of their keys
(``counters.repair``) before it completes the events, so that a pass dying
there leaves them in doubt for the next one. The events record every effect
either way, ``job_metrics`` included: once the pass ends, the counters are in step.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from typing import Any

from pymongo.client_session import ClientSession

from zombie_pipeline.cleanup import compensations, counters
from zombie_pipeline.cleanup.cache_errors import CacheWrite, write_batch
from zombie_pipeline.cleanup.counts import (
    Count,
    StepResult,
    cache_count,
    cache_generation_count,
    effect_count,
    reason_count,
    retry_count,
    type_count,
)
from zombie_pipeline.cleanup.detection import Candidate
from zombie_pipeline.cleanup.effects import CountersInDoubt
from zombie_pipeline.cleanup.events import (
    claim,
    drain,
    set_on_events,
    take_over_expired,
)
from zombie_pipeline.cleanup.retries import enqueue_due_retries, enqueue_retries
from zombie_pipeline.cleanup.strategies import (
    FinishOutcome,
    FinishStrategy,
    SortedClaims,
    strategy_for,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.documents import (
    ID,
    Event,
    EventState,
    Job,
    RetryOutcome,
    ZombieEvent,
    as_utc,
    job_row,
    utc_now,
)
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS, CacheGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.transactions import atomically, in_transactions


def finalize_zombies(
    store: Store,
    candidates: list[Candidate],
    policy: ZombiePolicy,
    run_id: str,
    now: dt.datetime,
    strategy: FinishStrategy,
    cache: CacheGeneration,
) -> StepResult:
    """Claim the candidates, then finalize every claim of the run (an earlier attempt's too)."""
    claimed = claim(store, candidates, policy, run_id, now, strategy.generation)
    return StepResult(claimed.counts).merge(finalize(store, run_id, policy, strategy, cache, fresh=claimed.ids))


def finalize(
    store: Store,
    run_id: str,
    policy: ZombiePolicy,
    strategy: FinishStrategy,
    cache: CacheGeneration,
    fresh: Collection[Any] = frozenset(),
) -> StepResult:
    """Drive this run's claimed events of ``strategy``'s generation to done, a batch at a time.

    ``fresh``: the events the caller has just claimed, untouched since. Any other claimed event of the run may
    have been partly done by an earlier pass whose reply was lost (a step retried in the same run) or that died
    (a run taken over), and is judged from what the database holds, never from what this process remembers.
    """
    result = StepResult()
    claimed = {Event.STATE: EventState.CLAIMED, Event.QUEUE_GENERATION: strategy.generation.name}
    for events in drain(store, run_id, claimed, policy):
        result.counts[cache_generation_count(cache.name)] = 1
        result.merge(_finalize_batch(store, run_id, events, policy, strategy, cache, fresh))
    return result


def reconcile(
    store: Store, run_id: str, policy: ZombiePolicy, cache: CacheGeneration, now: dt.datetime | None = None
) -> StepResult:
    """Complete what crashed runs left half done; runs first in every cleanup. Delayed retries that are due too.

    Each taken-over event is finished as the generation it records (its claim's), whatever the queue is now.
    """
    taken = take_over_expired(store, run_id, now or utc_now(), policy)
    result = StepResult()
    if taken:
        recorded = store.events.distinct(
            Event.QUEUE_GENERATION, {Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED}
        )
        for name in sorted(recorded):
            result.merge(finalize(store, run_id, policy, strategy_for(store, QUEUE_GENERATIONS[name]), cache))
    result.counts[Count.TAKEN_OVER] += taken
    result.counts.update(enqueue_due_retries(store, policy, now))
    return result


def _finalize_batch(
    store: Store,
    run_id: str,
    events: list[ZombieEvent],
    policy: ZombiePolicy,
    strategy: FinishStrategy,
    cache: CacheGeneration,
    fresh: Collection[Any],
) -> StepResult:
    """One batch from claimed to done; each part is safe to redo, the events are written once, at the end."""
    queue_client, cache_client = store.jobs.database.client, store.cache.database.client

    def finish(claims: SortedClaims) -> FinishOutcome:
        return atomically(queue_client, lambda session: strategy.finish(claims, session), policy.transactions)

    def write_errors(finished: list[ZombieEvent]) -> CacheWrite:
        def write(session: ClientSession | None) -> CacheWrite:
            return write_batch(store, finished, cache, policy, strategy.side.cache_metrics, session)

        return atomically(cache_client, write, policy.transactions)

    outcome, cached = strategy.finish_in_order(strategy.sort_claims(events, fresh), finish, write_errors)
    in_doubt = CountersInDoubt()
    if not in_transactions(queue_client, policy.transactions):
        in_doubt.merge(outcome.in_doubt)
    if not in_transactions(cache_client, policy.transactions):
        in_doubt.merge(cached.in_doubt)
    repaired = [counters.repair(store, strategy.side, in_doubt)]
    finished = [{**event, **cached[event[ID]]} for event in outcome.finished]
    now = utc_now()
    actions = compensations.registry(policy)

    def complete(session: ClientSession | None) -> dict[Any, RetryOutcome]:
        retried = enqueue_retries(store, finished, policy, strategy, now, session)
        if session is None:  # the counters of retries a pass that died inserted: set from a recount, before the events
            repaired.append(counters.repair(store, strategy.side, retried.in_doubt))
        decisions = retried.outcomes
        done = {
            event[ID]: {
                Event.STATE: EventState.DONE,
                **cached[event[ID]],
                Event.EFFECTS: outcome.effects[event[ID]],
                Event.RETRY_OUTCOME: decisions[event[ID]][0],
                **({Event.RETRY_DUE_AT: decisions[event[ID]][1]} if decisions[event[ID]][1] else {}),
                **compensations.pending_for(actions, event[Event.JOB][Job.TYPE]),
                Event.COMPLETED_AT: now,
            }
            for event in finished
        }
        set_on_events(store, run_id, done, session)
        if outcome.lost:  # a worker moved the job after detection: forget the claim, the job may be judged again later
            lost = [event[ID] for event in outcome.lost]
            store.events.delete_many(
                {ID: {"$in": lost}, Event.LEASE_OWNER: run_id, Event.STATE: EventState.CLAIMED}, session=session
            )
        return {event_id: decision[0] for event_id, decision in decisions.items()}

    retried = atomically(queue_client, complete, policy.transactions)
    result = _result(outcome, cached, retried)
    if sum(repaired):
        result.counts[Count.COUNTERS_REPAIRED] += sum(repaired)
    return result


def _result(outcome: FinishOutcome, cached: CacheWrite, retried: Mapping[Any, str]) -> StepResult:
    result = StepResult()
    result.counts[Count.FINALIZED] += len(outcome.finished)
    result.counts[Count.LOST_TO_LIVE_WORKER] += len(outcome.lost)
    for event in outcome.finished:
        result.counts[reason_count(event[Event.REASON])] += 1
        result.counts[type_count(event[Event.JOB][Job.TYPE])] += 1
        result.counts[cache_count(cached[event[ID]][Event.CACHE_OUTCOME])] += 1
        result.counts[retry_count(retried[event[ID]])] += 1
        result.counts.update(effect_count(effect) for effect in outcome.effects[event[ID]])
        result.rows.append(finalized_row(event))
    return result


def finalized_row(event: Mapping[str, Any]) -> dict[str, Any]:
    """A finalized zombie as one row of the run's table."""
    job = event[Event.JOB]
    return job_row(
        event[ID],
        job,
        reason=event[Event.REASON],
        threshold_seconds=event[Event.THRESHOLD_SECONDS],
        ran_seconds=round((event[Event.FINALIZED_AT] - as_utc(job[Job.STARTED_AT])).total_seconds(), 1),
    )
