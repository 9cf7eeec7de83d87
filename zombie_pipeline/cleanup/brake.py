"""The brake: so many started jobs look dead at once that the heartbeat path is more likely broken than the workers.

A cleanup judges it on what its detection found, the watcher on what falls due; either way nothing is written while
it is engaged, unless an operator overrides it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pymongo.collection import Collection

from zombie_pipeline.cleanup.detection import Detection, count_started_among
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.jobs import JobDocument


@dataclass(frozen=True)
class Brake:
    """Whether so many started jobs look dead that the heartbeat path is more likely broken."""

    stale: int
    started: int
    max_stale_fraction: float
    min_started: int

    @property
    def engaged(self) -> bool:
        return self.started >= self.min_started and self.stale > self.max_stale_fraction * self.started

    @property
    def stale_fraction(self) -> float:
        return self.stale / self.started if self.started else 0.0

    def message(self) -> str:
        """Why nothing was written, with the numbers, and what to do."""
        return (
            f"brake engaged: {self.stale} of {self.started} started jobs ({self.stale_fraction:.0%}) look dead, more "
            f"than max_stale_fraction={self.max_stale_fraction:.0%}; nothing was written. Workers whose heartbeats no "
            "longer reach the queue look exactly like dead ones: check that the running workers' heartbeats arrive "
            "(last_heartbeat of the started jobs); if they really died, run again with override_brake: true."
        )

    def facts(self) -> dict[str, int | float]:
        """The numbers the brake judged, for a person deciding whether to override it."""
        return {
            "stale": self.stale,
            "started": self.started,
            "stale_fraction": round(self.stale_fraction, 4),
            "max_stale_fraction": self.max_stale_fraction,
            "min_started_for_brake": self.min_started,
        }

    @classmethod
    def of(cls, policy: ZombiePolicy, stale: int, started: int) -> Brake:
        return cls(stale, started, policy.max_stale_fraction, policy.min_started_for_brake)


def brake_for(
    jobs: Collection[JobDocument], detection: Detection, policy: ZombiePolicy, job_types: Iterable[str] | None = None
) -> Brake:
    """The brake judged on ``detection``'s candidates still started, among the started jobs (of ``job_types``)."""
    ids = [candidate.id for candidate in detection.candidates]
    started, stale = count_started_among(jobs, ids, job_types)
    return Brake.of(policy, stale=stale, started=started)
