"""The record of suggested T2 (``zombieT2Suggestions``) and the cleanup's opt-in to it."""

from __future__ import annotations

from tests.statistics.builders import DAY, NEXT_DAY, tally, week
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import T2Suggestion
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.statistics.analysis import analyze
from zombie_pipeline.statistics.suggestion_log import effective_policy, latest_suggested_max_durations, save_suggestions


def test_latest_suggested_max_durations_come_from_the_newest_window_and_only_with_enough_data(store):
    collection = store.suggestions
    assert latest_suggested_max_durations(collection) == {}
    policy = ZombiePolicy()
    newer = analyze(week({"/a": tally([100.0] * 400), "/rare": tally([5.0] * 3)}, NEXT_DAY), policy)
    older = analyze(week({"/a": tally([1000.0] * 400)}, DAY), policy)

    save_suggestions(collection, newer)
    save_suggestions(collection, older)  # a backfill of an older window
    save_suggestions(collection, newer)  # recomputing a window replaces its document

    assert collection.count_documents({}) == 2
    assert latest_suggested_max_durations(collection) == {"/a": 300}
    assert latest_suggested_max_durations(collection, minimum_seconds=600) == {"/a": 600}
    stored = collection.find_one({ID: NEXT_DAY})
    assert {entry[T2Suggestion.TYPE]: entry[T2Suggestion.ENOUGH_DATA] for entry in stored[T2Suggestion.BY_TYPE]} == {
        "/a": True,
        "/rare": False,
    }


def test_an_opted_in_policy_takes_the_suggested_t2_of_each_type_and_keeps_the_others(store):
    collection = store.suggestions
    policy = ZombiePolicy(max_duration_seconds_by_type={"/a": 3600, "/b": 2400}, use_suggested_max_durations=True)
    assert effective_policy(policy, collection) is policy  # nothing suggested yet
    save_suggestions(collection, analyze(week({"/a": tally([100.0] * 400), "/c": tally([400.0] * 400)}), policy))

    in_force = effective_policy(policy, collection)

    assert in_force.max_duration_seconds_by_type == {"/a": 300, "/b": 2400, "/c": 600}
    floor = ZombiePolicy(heartbeat_timeout_seconds=450, use_suggested_max_durations=True)
    assert effective_policy(floor, collection).max_duration_of("/a") == 450


def test_a_policy_that_does_not_opt_in_is_the_one_configured(store):
    policy = ZombiePolicy(max_duration_seconds_by_type={"/a": 3600})
    save_suggestions(store.suggestions, analyze(week({"/a": tally([100.0] * 400)}), policy))

    assert effective_policy(policy, store.suggestions) is policy


def test_a_partial_window_never_replaces_the_suggestions_of_a_fuller_one(store):
    collection = store.suggestions
    policy = ZombiePolicy()
    full = analyze(week({"/a": tally([100.0] * 400)}), policy)
    partial = analyze(week({"/a": tally([1000.0] * 400)}), policy, missing_days=["2024-02-28", "2024-02-29"])
    fuller_partial = analyze(week({"/a": tally([200.0] * 400)}), policy, missing_days=["2024-02-28"])

    assert save_suggestions(collection, partial)
    assert save_suggestions(collection, fuller_partial)  # more days: it replaces the partial one
    assert save_suggestions(collection, full)
    assert not save_suggestions(collection, partial)  # fewer days: the full week's record is kept

    [stored] = collection.find()
    assert (stored[T2Suggestion.DAYS_PRESENT], stored[T2Suggestion.DAYS_EXPECTED]) == (7, 7)
    assert latest_suggested_max_durations(collection) == {"/a": 300}
