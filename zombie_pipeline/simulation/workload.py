"""What a simulation writes: the job types with their duration laws, and how many jobs of each kind.

Validated where it is built, each problem named by its field, so the CLI can name
the option a person typed; the healthy started jobs beside the dead are sized so
that a simulated queue never trips the cleanup's brake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from zombie_pipeline.messages import shown
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.generations import (
    CACHE_GENERATIONS,
    NEWEST_QUEUE_GENERATION,
    QUEUE_GENERATIONS,
    CacheGeneration,
    DurationsSource,
    QueueGeneration,
)
from zombie_pipeline.queue.jobs import Job


@dataclass(frozen=True)
class JobType:
    """A processing step with its own duration law (log-normal: a long right tail)."""

    name: str
    level: str  # "dataset", "config" or "split": which of config/split the job carries
    median_seconds: float
    sigma: float
    error_rate: float
    difficulty: int = 50


JOB_TYPES: tuple[JobType, ...] = (
    JobType("/config-names", "dataset", 4, 0.7, 0.05, 50),
    JobType("/split-names-from-streaming", "config", 25, 1.0, 0.10, 60),
    JobType("/splits", "dataset", 30, 1.1, 0.08, 50),
    JobType("/first-rows", "split", 70, 1.2, 0.12, 70),
    JobType("/parquet-and-dataset-info", "dataset", 280, 1.0, 0.15, 90),
    JobType("/parquet", "dataset", 3, 0.6, 0.02, 20),  # sigma >= 0.6: p99/p50 = exp(2.33 sigma) > 4
    JobType("/dataset-info", "dataset", 3, 0.6, 0.02, 20),
    JobType("/sizes", "dataset", 2, 0.6, 0.01, 20),
    JobType("/split-names-from-dataset-info", "config", 5, 0.6, 0.03, 20),
)
STARTED_KINDS = ("crashed", "never_heartbeated", "terminated", "overdue", "running")


#: A simulated queue keeps its dead to at most this share of the brake's threshold (``max_stale_fraction``), so that
#: whatever moves meanwhile (a worker finishing, another dying) the brake never stops a cleanup of it.
BRAKE_MARGIN = 0.5


def healthy_beside(dead: int, policy: ZombiePolicy) -> int:
    """How many healthy started jobs keep ``dead`` ones at most :data:`BRAKE_MARGIN` of the brake's threshold."""
    share = BRAKE_MARGIN * policy.max_stale_fraction
    return max(math.ceil(dead * (1 - share) / share), policy.min_started_for_brake)


class WorkloadError(ValueError):
    """A workload that cannot be simulated; the message names the field."""


@dataclass(frozen=True)
class Workload:
    """How many jobs of each kind to create, in which generation."""

    finished: int = 2_000
    crashed: int = 20  # started, heartbeat stopped long ago
    never_heartbeated: int = 5  # started, no heartbeat at all
    terminated: int = 3  # started, SIGTERM recorded long ago (only where jobs carry terminated_at)
    overdue: int = 5  # started, alive, but past its type's maximum duration
    running: int = 50  # started, healthy
    waiting: int = 50
    days: float = 7.0
    seed: int = 0
    policy: ZombiePolicy = field(default_factory=ZombiePolicy)  # the thresholds the simulated zombies break
    generation: str = NEWEST_QUEUE_GENERATION
    cache_generation: str | None = None  # None: the one the queue generation's deployment writes
    job_types: tuple[JobType, ...] = JOB_TYPES
    past_cleanups: int = 0  # days before today, each cleaned by its cleanup (history.py); 0: no audit trail

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be a non-negative integer, got {shown(getattr(self, name))}"
            for name in (
                "finished",
                "crashed",
                "never_heartbeated",
                "terminated",
                "overdue",
                "running",
                "waiting",
                "seed",
                "past_cleanups",
            )
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0
        ]
        if not isinstance(self.days, (int, float)) or not self.days > 0:
            problems.append(f"days must be positive, got {shown(self.days)}")
        if self.generation not in QUEUE_GENERATIONS:
            problems.append(f"generation must be one of {', '.join(QUEUE_GENERATIONS)}, got {shown(self.generation)}")
        if self.cache_generation is not None and self.cache_generation not in CACHE_GENERATIONS:
            problems.append(
                f"cache_generation must be one of {', '.join(CACHE_GENERATIONS)}, got {shown(self.cache_generation)}"
            )
        if problems:
            raise WorkloadError("invalid workload: " + "; ".join(problems))

    @classmethod
    def from_fractions(
        cls,
        jobs: int,
        crashed_fraction: float = 0.01,
        never_heartbeated_fraction: float = 0.002,
        overdue_fraction: float = 0.002,
        running_fraction: float = 0.02,
        waiting_fraction: float = 0.02,
        **options: Any,
    ) -> Workload:
        """``jobs`` in all; the fractions say which share of them is in which state."""
        if not isinstance(jobs, int) or jobs < 0:
            raise WorkloadError(f"invalid workload: jobs must be a non-negative integer, got {shown(jobs)}")
        fractions = {
            "crashed": crashed_fraction,
            "never_heartbeated": never_heartbeated_fraction,
            "overdue": overdue_fraction,
            "running": running_fraction,
            "waiting": waiting_fraction,
        }
        bad = [
            f"{name}_fraction must be in [0, 1], got {shown(value)}"
            for name, value in fractions.items()
            if not 0 <= value <= 1
        ]
        if bad:
            raise WorkloadError("invalid workload: " + "; ".join(bad))
        counts: dict[str, Any] = {name: round(jobs * fraction) for name, fraction in fractions.items()}
        finished = jobs - sum(counts.values())
        if finished < 0:
            raise WorkloadError("invalid workload: the fractions add up to more than 1")
        return cls(finished=finished, terminated=0, **counts, **options)

    @property
    def queue_generation(self) -> QueueGeneration:
        return QUEUE_GENERATIONS[self.generation]

    @property
    def cache(self) -> CacheGeneration:
        return CACHE_GENERATIONS[self.cache_generation or self.queue_generation.cache_generation]

    @property
    def terminated_jobs(self) -> int:
        """Terminated jobs exist only where jobs carry ``terminated_at``."""
        return self.terminated if self.queue_generation.declares(Job.TERMINATED_AT) else 0

    @property
    def zombies(self) -> int:
        return self.crashed + self.never_heartbeated + self.terminated_jobs + self.overdue

    @property
    def started(self) -> int:
        return self.zombies + self.running

    @property
    def total(self) -> int:
        """Job documents written: the finished history stays in the queue only where finished jobs are kept."""
        kept = self.finished if self.queue_generation.durations_source is DurationsSource.FINISHED_JOBS else 0
        return kept + self.started + self.waiting
