"""The record of suggested T2 values (``zombieT2Suggestions``), and the cleanup's opt-in to them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import T2Suggestion
from zombie_pipeline.queue.jobs import ID

if TYPE_CHECKING:  # the cleanup reads the suggestions (effective_policy) without the statistics' pandas
    from zombie_pipeline.statistics.analysis import DurationReport


def save_suggestions(collection: Collection[Any], report: DurationReport) -> bool:
    """Record the window's suggestions; False when a record of the same window covering more of its days is kept.

    Recomputing a window replaces its document, but a partial window (days not computed yet) never
    replaces a fuller one.
    """
    document = {
        ID: report.window_end,
        T2Suggestion.WINDOW_START: report.window_start,
        T2Suggestion.WINDOW_END: report.window_end,
        T2Suggestion.DAYS_PRESENT: report.days_present,
        T2Suggestion.DAYS_EXPECTED: report.days_expected,
        T2Suggestion.COMPUTED_AT: report.computed_at,
        T2Suggestion.SETTINGS: {
            **report.rules.as_dict(),
            "heartbeat_timeout_seconds": report.heartbeat_timeout_seconds,
        },
        T2Suggestion.BY_TYPE: [
            {
                T2Suggestion.TYPE: entry.job_type,
                T2Suggestion.SUGGESTED_T2_SECONDS: entry.suggested_t2_seconds,
                T2Suggestion.CURRENT_T2_SECONDS: entry.current_t2_seconds,
                T2Suggestion.ENOUGH_DATA: entry.enough_data,
                T2Suggestion.CENSORED: entry.censored,
                T2Suggestion.SAMPLES: entry.successes,
            }
            for entry in report.types
        ],
    }
    no_fuller = {
        "$or": [
            {T2Suggestion.DAYS_PRESENT: {"$lte": report.days_present}},
            {T2Suggestion.DAYS_PRESENT: {"$exists": False}},
        ]
    }
    try:
        collection.replace_one({ID: report.window_end, **no_fuller}, document, upsert=True)
    except DuplicateKeyError:  # the window's record exists and covers more days: the upsert's insert collides
        return False
    return True


def latest_suggested_max_durations(collection: Collection[Any], minimum_seconds: int = 0) -> dict[str, int]:
    """T2 per job type from the most recent window with enough data; {} when there is none.

    Types without enough data are left out, so the policy's own value stays.
    ``minimum_seconds`` (e.g. the current heartbeat timeout) raises any value
    below it, so the result always passes policy validation.
    """
    latest = collection.find_one({}, {T2Suggestion.BY_TYPE: 1}, sort=[(ID, -1)])
    if latest is None:
        return {}
    suggestions = {}
    for entry in latest.get(T2Suggestion.BY_TYPE) or []:
        job_type, seconds = entry.get(T2Suggestion.TYPE), entry.get(T2Suggestion.SUGGESTED_T2_SECONDS)
        usable = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
        if entry.get(T2Suggestion.ENOUGH_DATA) is True and isinstance(job_type, str) and job_type and usable:
            suggestions[job_type] = max(int(seconds), minimum_seconds)
    return suggestions


def effective_policy(policy: ZombiePolicy, suggestions: Collection[Any]) -> ZombiePolicy:
    """The policy a cleanup applies: ``policy``, with the latest suggested T2 per type when it opts in.

    A suggestion replaces the configured value of its type; types without one
    keep theirs. Never below the heartbeat timeout, so the result always validates.
    """
    if not policy.use_suggested_max_durations:
        return policy
    suggested = latest_suggested_max_durations(suggestions, minimum_seconds=policy.heartbeat_timeout_seconds)
    return policy.with_max_durations(suggested) if suggested else policy
