"""The brake (``cleanup/brake.py``): engaged only when more than its share of enough started jobs look dead."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.helpers import job_document
from zombie_pipeline.cleanup.brake import Brake, brake_for
from zombie_pipeline.cleanup.detection import detect
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.times import utc_now

POLICY = ZombiePolicy(max_stale_fraction=0.5, min_started_for_brake=20)


@pytest.mark.parametrize(
    "stale, started, engaged",
    [(11, 20, True), (10, 20, False), (19, 19, False), (0, 0, False), (51, 100, True)],
)
def test_the_brake_engages_only_when_more_than_the_fraction_of_enough_started_jobs_look_dead(stale, started, engaged):
    brake = Brake(stale=stale, started=started, max_stale_fraction=0.5, min_started=20)
    assert brake.engaged is engaged
    if engaged:
        assert "override_brake" in brake.message()


def test_the_brake_counts_the_dead_still_started_beside_a_cleanup_that_finalized_some_since_they_were_found(store):
    """Found 30 dead of 60 started (not more than half); another cleanup then finalizes 2: 28 of 58, not 30 of 58."""
    now = utc_now()
    dead = [
        job_document(dataset=f"user/dead-{n}", started_at=now - dt.timedelta(hours=1), last_heartbeat=None)
        for n in range(30)
    ]
    alive = [
        job_document(dataset=f"user/alive-{n}", started_at=now - dt.timedelta(minutes=1), last_heartbeat=now)
        for n in range(30)
    ]
    store.jobs.insert_many(dead + alive)
    detection = detect(store.jobs, POLICY, now)
    assert len(detection.candidates) == 30
    store.jobs.delete_many({ID: {"$in": [job[ID] for job in dead[:2]]}})  # finalized by the other cleanup

    brake = brake_for(store.jobs, detection, POLICY, None)

    assert (brake.stale, brake.started) == (28, 58)
    assert not brake.engaged
