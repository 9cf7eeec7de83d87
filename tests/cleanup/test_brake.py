"""The brake (``cleanup/brake.py``): engaged only when more than its share of enough started jobs look dead."""

from __future__ import annotations

import pytest

from zombie_pipeline.cleanup.brake import Brake


@pytest.mark.parametrize(
    "stale, started, engaged",
    [(11, 20, True), (10, 20, False), (19, 19, False), (0, 0, False), (51, 100, True)],
)
def test_the_brake_engages_only_when_more_than_the_fraction_of_enough_started_jobs_look_dead(stale, started, engaged):
    brake = Brake(stale=stale, started=started, max_stale_fraction=0.5, min_started=20)
    assert brake.engaged is engaged
    if engaged:
        assert "override_brake" in brake.message()
