"""Why a started job is a zombie (its reason) and why its worker stopped (its cause): our verdicts, in the events."""

from __future__ import annotations

from enum import StrEnum

from zombie_pipeline.queue.cache import ErrorCode


class Reason(StrEnum):
    """Why a started job is a zombie; each reason maps to the error code users see."""

    MISSING_HEARTBEAT = "missing_heartbeat"
    NEVER_HEARTBEATED = "never_heartbeated"
    TERMINATED = "terminated"  # SIGTERM recorded, then silence
    EXCEEDED_MAX_DURATION = "exceeded_max_duration"


REASONS = tuple(Reason)

#: The reasons whose worker is gone (dead, or SIGTERMed then silent); a job past its maximum duration still beats.
WORKER_GONE = frozenset({Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.TERMINATED})

ERROR_CODE_OF_REASON = {
    Reason.MISSING_HEARTBEAT: ErrorCode.CRASHED,
    Reason.NEVER_HEARTBEATED: ErrorCode.CRASHED,
    Reason.TERMINATED: ErrorCode.CRASHED,
    Reason.EXCEEDED_MAX_DURATION: ErrorCode.EXCEEDED_MAX_DURATION,
}


class Cause(StrEnum):
    """Why the worker of a finalized zombie stopped, as far as the queue can tell (``cleanup.causes`` decides)."""

    DEPLOY = "deploy"  # stopped with many other workers at once (a wave), or SIGTERMed alone within its free re-runs
    CRASH = "crash"  # a worker that died alone (OOM-kill, eviction, a bug), or SIGTERMed alone past its free re-runs
    NEVER_STARTED = "never_started"  # its worker never sent a heartbeat, and died alone
    TIMEOUT = "timeout"  # alive, but past its type's maximum duration (T2)


CAUSES = tuple(Cause)

#: The causes a reason can have: a dead job is a deploy death when it is part of a wave; a job SIGTERMed alone is one
#: within its (dataset, job type)'s free re-runs, a crash past them (``cleanup.budget``).
CAUSES_OF_REASON = {
    Reason.TERMINATED: (Cause.DEPLOY, Cause.CRASH),
    Reason.MISSING_HEARTBEAT: (Cause.DEPLOY, Cause.CRASH),
    Reason.NEVER_HEARTBEATED: (Cause.DEPLOY, Cause.NEVER_STARTED),
    Reason.EXCEEDED_MAX_DURATION: (Cause.TIMEOUT,),
}
