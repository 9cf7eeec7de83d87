"""Every sentence a user reads, once: what a killed job's cache entry says, and counts agreed with their nouns
("1 zombie", "2 zombies", "0 retries")."""

from __future__ import annotations

import math

from zombie_pipeline.queue.reasons import Reason

#: Nouns whose plural is not the noun and an ``s``.
_PLURALS = {
    "retry": "retries",
    "was": "were",
    "is": "are",
    "has": "have",
    "its": "their",
    "it": "them",
    "this": "these",
}


def plural(count: int | float, noun: str, many: str | None = None) -> str:
    """``noun`` as ``count`` of them are said: the noun itself for one, else ``many`` (default: the noun's plural)."""
    if count == 1:
        return noun
    if many is not None:
        return many
    last = noun.rsplit(" ", 1)[-1]
    head = noun[: len(noun) - len(last)]
    if last in _PLURALS:
        return head + _PLURALS[last]
    if last.endswith(("s", "x", "sh", "ch")):
        return noun + "es"
    if last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + "s"


def counted(count: int | float, noun: str, many: str | None = None) -> str:
    """``1 zombie``, ``2 zombies``: a count and its noun, agreed."""
    return (
        f"{count:g} {plural(count, noun, many)}" if isinstance(count, float) else f"{count} {plural(count, noun, many)}"
    )


def shown(value: object) -> str:
    """A value as a person typed it: ``-3`` for the float -3.0 an option parsed, ``1.5``, ``'abc'``."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}" if abs(value) < 1e15 else repr(value)
    return repr(value)


_CRASHED_MESSAGE = "The worker running this job stopped sending heartbeats and is presumed dead; the job was stopped by the zombie cleanup."

#: The message users read in the cache entry, in our own words.
ERROR_MESSAGE_OF_REASON = {
    Reason.MISSING_HEARTBEAT: _CRASHED_MESSAGE,
    Reason.NEVER_HEARTBEATED: _CRASHED_MESSAGE,
    Reason.TERMINATED: "The worker running this job was terminated by its platform (for instance to free resources) "
    "and did not finish it; the job was stopped by the zombie cleanup and may run again later.",
    Reason.EXCEEDED_MAX_DURATION: "This job ran longer than the maximum duration allowed for its type "
    "and was stopped by the zombie cleanup.",
}

#: What users read of a job whose worker stopped (or was SIGTERMed) in a wave with many others.
DEPLOY_WAVE_MESSAGE = (
    "The worker running this job stopped at the same moment as many other workers (a deployment or a restart of the "
    "workers), not because of this job; the job was stopped by the zombie cleanup and may run again."
)


def terminated_alone_message(free: int, limit: int, window_hours: int) -> str:
    """What users read of a job whose worker was SIGTERMed alone, re-run without counting a failure (the ``free``-th
    of ``limit`` such re-runs of its step on this dataset within ``window_hours``)."""
    return (
        "The worker running this job was terminated by its platform on its own, not with many others as in a "
        "deployment (for instance evicted from its node for lack of memory); the job was stopped by the zombie cleanup "
        f"and runs again without counting as a failure ({free} of {limit} such re-runs within {window_hours} hours "
        "on this dataset)."
    )


def terminated_too_often_message(alone: int, window_hours: int) -> str:
    """What users read of a job whose worker was SIGTERMed alone once more than its free re-runs allow."""
    return (
        f"The worker running this job was terminated on its own {alone} times within {window_hours} hours on this "
        "dataset, more often than deployments or node maintenance explain (most likely the job uses more memory than "
        "its worker has); this time counts as a failed run, as a crash would."
    )


def quarantine_message(crashes: int, window_hours: int) -> str:
    """What users read of a job whose (dataset, job type) is quarantined: one sentence."""
    return (
        f"This step crashed its worker {crashes} times within {window_hours} hours on this dataset, so it is "
        "quarantined and will not run again automatically until a maintainer lifts the quarantine or the dataset "
        "is updated."
    )
