"""Undoing what a zombie left half done: actions per job type, run at least once after its cache entry is written.

A job killed mid-way may have written part of its output elsewhere (a commit
on a dataset repository's branch, a file in a bucket); only an action that
knows the step can undo it. The cleanup marks each finalized zombie with the
actions that apply to its type (``compensation_state: pending`` on its event);
:func:`compensate`, a later step of the same run, runs them and records each
outcome on the event. An action that fails is tried again by later runs, up
to ``compensation_max_attempts``, then left ``failed`` for an operator (the
``compensations_succeed`` check shows it). A failure never stops the others.

Delivery is at least once: a run that dies between an action and its record
runs it again, so every action gets the zombie's job id as its idempotency key.

Actions come from two places:

- Python entry points of the group ``zombie_pipeline.compensations``: each
  names an object (or a class built without arguments) with a ``name``, an
  ``applies_to(job_type)`` and a ``run(context)`` that raises when it fails;
- the policy's ``compensation_webhooks``: a job type (or ``*``) -> the name of
  an environment variable holding a URL, POSTed the context as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from zombie_pipeline.cleanup.results import Count, StepResult
from zombie_pipeline.config import setting
from zombie_pipeline.observability import webhooks
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import (
    CompensationEntry,
    CompensationRecord,
    CompensationState,
    Event,
    EventState,
    PreviousEntrySummary,
    ZombieEvent,
)
from zombie_pipeline.queue.jobs import ID, JobSnapshot, job_row
from zombie_pipeline.queue.secrets import scrub
from zombie_pipeline.queue.store import READ_BATCH, Store
from zombie_pipeline.queue.times import utc_now

ENTRY_POINT_GROUP = "zombie_pipeline.compensations"
#: How long one run holds an event's compensations: another cleanup at the same time leaves it alone.
LEASE = dt.timedelta(minutes=15)
ERROR_LENGTH = 500


class CompensationError(RuntimeError):
    """An action failed, or cannot be loaded; the message is safe to record (no credentials)."""


@dataclass(frozen=True)
class CompensationContext:
    """What an action knows of the zombie it undoes."""

    job_id: Any  # the idempotency key: the same for every attempt
    job: JobSnapshot  # the job as detection saw it
    reason: str
    error_code: str
    cache_outcome: str | None  # written, or kept because a fresher result was there
    previous_entry: PreviousEntrySummary | None  # what the cache held before our error entry (revision, runner version)
    attempt: int  # 1 for the first

    def as_json(self) -> dict[str, Any]:
        as_json: dict[str, Any] = json.loads(json.dumps(dict(vars(self)), default=str))
        return as_json


@runtime_checkable
class Compensation(Protocol):
    @property
    def name(self) -> str: ...

    def applies_to(self, job_type: str) -> bool: ...

    def run(self, context: CompensationContext) -> None: ...


@dataclass(frozen=True)
class WebhookCompensation:
    """POST the context as JSON to the URL in ``$variable``; any answer but 2xx, or none in time, is a failure."""

    job_type: str  # "*": every type
    variable: str
    timeout_seconds: float

    @property
    def name(self) -> str:
        return f"webhook {self.variable}"

    def applies_to(self, job_type: str) -> bool:
        return self.job_type in ("*", job_type)

    def run(self, context: CompensationContext) -> None:
        url = setting(self.variable)
        if url is None:
            raise CompensationError(f"${self.variable} is not set: no URL to POST to")
        try:
            webhooks.post_json(
                url, context.as_json(), self.timeout_seconds, headers={"Idempotency-Key": str(context.job_id)}
            )
        except webhooks.WebhookError as error:
            raise CompensationError(str(error)) from None


# --- the registry ------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def installed() -> tuple[Compensation, ...]:
    """The actions installed packages register under :data:`ENTRY_POINT_GROUP` (loaded once per process)."""
    actions = []
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry_point.load()
            action = loaded() if isinstance(loaded, type) else loaded
        except Exception as error:  # a broken plugin is refused with its name, before anything is written
            raise CompensationError(
                f"the compensation entry point {entry_point.name!r} ({entry_point.value}) cannot be loaded: {error}"
            ) from error
        if not isinstance(action, Compensation) or not isinstance(getattr(action, "name", None), str):
            raise CompensationError(
                f"the compensation entry point {entry_point.name!r} ({entry_point.value}) is not an action: "
                "it needs a name, applies_to(job_type) and run(context)"
            )
        actions.append(action)
    return tuple(actions)


def registry(policy: ZombiePolicy) -> tuple[Compensation, ...]:
    """Every action in force: the installed ones, then the policy's webhooks; names are unique."""
    webhooks = [
        WebhookCompensation(job_type, variable, policy.compensation_timeout_seconds)
        for job_type, variable in sorted(policy.compensation_webhooks.items())
    ]
    actions: tuple[Compensation, ...] = (*installed(), *webhooks)
    names = [action.name for action in actions]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise CompensationError(f"two compensations share a name: {twice}")
    return actions


def pending_for(actions: Iterable[Compensation], job_type: str) -> ZombieEvent:
    """The event fields that ask for the actions applying to ``job_type``; none when none applies."""
    names = [action.name for action in actions if action.applies_to(job_type)]
    if not names:
        return {}
    return {
        Event.COMPENSATION_STATE: CompensationState.PENDING,
        Event.COMPENSATIONS: [
            {
                CompensationEntry.NAME: name,
                CompensationEntry.STATE: CompensationState.PENDING,
                CompensationEntry.ATTEMPTS: 0,
            }
            for name in names
        ],
    }


# --- running them --------------------------------------------------------------------------------


def compensate(
    store: Store, policy: ZombiePolicy, run_id: str, actions: Iterable[Compensation], now: dt.datetime | None = None
) -> StepResult:
    """Run the pending actions of every finalized zombie once, and record each outcome on its event."""
    by_name = {action.name: action for action in actions}
    result = StepResult()
    last_id = None
    while True:
        query: dict[str, Any] = {Event.STATE: EventState.DONE, Event.COMPENSATION_STATE: CompensationState.PENDING}
        if last_id is not None:
            query[ID] = {"$gt": last_id}
        ids = [document[ID] for document in store.events.find(query, {ID: 1}).sort(ID, 1).limit(READ_BATCH)]
        if not ids:
            return result
        last_id = ids[-1]
        for event_id in ids:
            event = _lease(store, event_id, run_id, now or utc_now())
            if event is not None:
                result.counts.update(_compensate_one(store, event, policy, by_name, run_id))


def _lease(store: Store, event_id: Any, run_id: str, now: dt.datetime) -> ZombieEvent | None:
    """The event, held for this run; None when another run holds it or it is no longer pending."""
    free = {
        "$or": [{Event.COMPENSATION_LEASE_UNTIL: {"$exists": False}}, {Event.COMPENSATION_LEASE_UNTIL: {"$lt": now}}]
    }
    return store.events.find_one_and_update(
        {ID: event_id, Event.COMPENSATION_STATE: CompensationState.PENDING, **free},
        {"$set": {Event.COMPENSATION_LEASE_UNTIL: now + LEASE, Event.COMPENSATION_LEASE_OWNER: run_id}},
        return_document=True,
    )


def _compensate_one(
    store: Store, event: ZombieEvent, policy: ZombiePolicy, by_name: Mapping[str, Compensation], run_id: str
) -> list[Count]:
    entries: list[CompensationRecord] = [CompensationRecord(**entry) for entry in event.get(Event.COMPENSATIONS) or []]
    outcomes = []
    for entry in entries:
        if entry.get(CompensationEntry.STATE) != CompensationState.PENDING:
            continue
        action = by_name.get(str(entry.get(CompensationEntry.NAME)))
        attempts = int(entry.get(CompensationEntry.ATTEMPTS) or 0) + 1
        entry[CompensationEntry.ATTEMPTS] = attempts
        try:
            if action is None:
                raise CompensationError("no longer registered: not run")
            action.run(_context_of(event, attempts))
        except Exception as error:  # one failing action never stops the others, nor the cleanup
            entry[CompensationEntry.LAST_ERROR] = scrub(f"{type(error).__name__}: {error}")[:ERROR_LENGTH]
            exhausted = action is None or attempts >= policy.compensation_max_attempts
            entry[CompensationEntry.STATE] = CompensationState.FAILED if exhausted else CompensationState.PENDING
            outcomes.append(Count.COMPENSATION_FAILED if exhausted else Count.COMPENSATION_TO_RETRY)
        else:
            entry[CompensationEntry.STATE] = CompensationState.DONE
            entry[CompensationEntry.DONE_AT] = utc_now()
            entry.pop(CompensationEntry.LAST_ERROR, None)
            outcomes.append(Count.COMPENSATION_DONE)
    states = {entry.get(CompensationEntry.STATE) for entry in entries}
    overall = next(
        (state for state in (CompensationState.PENDING, CompensationState.FAILED) if state in states),
        CompensationState.DONE,
    )
    store.events.update_one(
        {ID: event[ID], Event.COMPENSATION_LEASE_OWNER: run_id},
        {
            "$set": {Event.COMPENSATIONS: entries, Event.COMPENSATION_STATE: overall},
            "$unset": {Event.COMPENSATION_LEASE_UNTIL: "", Event.COMPENSATION_LEASE_OWNER: ""},
        },
    )
    return outcomes


def _context_of(event: ZombieEvent, attempt: int) -> CompensationContext:
    return CompensationContext(
        job_id=event[ID],
        job=event.get(Event.JOB) or {},
        reason=event[Event.REASON],
        error_code=event[Event.ERROR_CODE],
        cache_outcome=event.get(Event.CACHE_OUTCOME),
        previous_entry=event.get(Event.PREVIOUS_ENTRY),
        attempt=attempt,
    )


# --- what the check reads ------------------------------------------------------------------------


@dataclass
class CompensationAudit:
    """Actions given up on (``failed``) and actions failing but still to be tried again."""

    failed: int
    retrying: int
    pending: int
    sample: list[dict[str, Any]]

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.retrying == 0


def audit(store: Store, sample_size: int = 20) -> CompensationAudit:
    failing = {Event.COMPENSATION_STATE: {"$in": [CompensationState.FAILED, CompensationState.PENDING]}}
    sample: list[dict[str, Any]] = []
    failed = retrying = pending = 0
    for event in store.events.find(failing, {Event.JOB: 1, Event.COMPENSATIONS: 1, Event.FINALIZED_AT: 1}).sort(
        Event.FINALIZED_AT, 1
    ):
        for entry in event.get(Event.COMPENSATIONS) or []:
            state, error = entry.get(CompensationEntry.STATE), entry.get(CompensationEntry.LAST_ERROR)
            failed += state == CompensationState.FAILED
            retrying += state == CompensationState.PENDING and error is not None
            pending += state == CompensationState.PENDING and error is None
            if error is not None and len(sample) < sample_size:
                sample.append(
                    job_row(
                        event[ID],
                        event.get(Event.JOB) or {},
                        action=entry.get(CompensationEntry.NAME),
                        state=state,
                        attempts=entry.get(CompensationEntry.ATTEMPTS),
                        last_error=error,
                    )
                )
    return CompensationAudit(failed=failed, retrying=retrying, pending=pending, sample=sample)
