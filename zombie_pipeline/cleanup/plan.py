"""What the steps of one cleanup run pass along, from op to op: its options, the policy in force, the generations.

Plain frozen values (Dagster hands them from one op to the next): everything a
step needs is decided once, in the first (``run.prepare``), and the run's state
lives in the database.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, replace

from zombie_pipeline.cleanup.results import StepResult
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.evidence import Generations


@dataclass(frozen=True)
class CleanupOptions:
    """What one run was asked to do."""

    dry_run: bool = False  # list the zombies with their evidence; write nothing
    override_brake: bool = False
    job_types: tuple[str, ...] | None = None  # None: every type


@dataclass(frozen=True)
class CleanupPlan:
    """What the steps of one run pass along: its options, the policy in force and the generations decided."""

    run_id: str
    policy: ZombiePolicy
    options: CleanupOptions
    generations: Generations
    started_at: dt.datetime
    counts: tuple[tuple[str, int], ...] = ()  # what the steps so far did
    found: tuple[tuple[str, str, int], ...] = ()  # (job type, reason, zombies) as detection returned them
    policy_source: str = ""  # where the policy came from (``policy.PolicySource.describe``), for the summary

    def add(self, result: StepResult) -> CleanupPlan:
        merged = Counter(dict(self.counts))
        merged.update(result.counts)
        return replace(self, counts=tuple(sorted(merged.items())))
