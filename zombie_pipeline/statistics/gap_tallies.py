"""What watching the started jobs comes to, per job type and worker size: the gaps, and how the jobs ended.

A *gap* is the time between two signs of life of a live job seen complete: its start and its first heartbeat,
then each heartbeat and the next. What is seen only in part is never a gap:

- the silence at a job's end (its last sign of life to the refresh that no longer holds it) is censored: the
  job finished, or died, before its next heartbeat. For a job that **finished** (it left the started jobs without
  a finalization of ours, and sooner than the deployment's own killer could have taken it), that last silence is
  a lower bound of a silence it lived through, so it counts in the job's *longest silence*: a timeout shorter
  than that would have finalized the job while it lived. Jobs watched only from their middle are counted apart
  (their earlier silences are unknown);
- a job that one of our cleanups finalized leaves its last gap open: counted (``finalized``), never a sample;
- a heartbeat that came while the watcher looked away for longer than its refreshes allow may hide another one
  before it: that gap is counted as ``unobserved``, never a sample.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from zombie_pipeline.queue.audit_documents import WORKER_UNTOLD
from zombie_pipeline.statistics.gap_histogram import GapHistogram

#: (job type, worker size) of a tally.
GapKey = tuple[str, str]


def row_name(job_type: str, worker: str) -> str:
    """How a report names a (job type, worker size): the type alone where the queue tells no worker size."""
    return f"`{job_type}`" if worker == WORKER_UNTOLD else f"`{job_type}` on {worker}"


@dataclass
class GapTally:
    """One job type on one worker size over some time; tallies add up exactly."""

    gaps: GapHistogram = field(default_factory=GapHistogram)
    finished: GapHistogram = field(default_factory=GapHistogram)  # longest silence of each job watched from its start
    partly_watched: int = 0  # finished jobs first seen after their first heartbeat
    finalized: int = 0  # jobs our cleanups finalized while watched: their last gap never closed
    ended_unseen: int = 0  # gone without our finalization, after a silence the deployment's killer acts on
    unobserved: int = 0  # gaps that ended while the watcher looked away

    def __add__(self, other: GapTally) -> GapTally:
        return GapTally(
            gaps=self.gaps + other.gaps,
            finished=self.finished + other.finished,
            partly_watched=self.partly_watched + other.partly_watched,
            finalized=self.finalized + other.finalized,
            ended_unseen=self.ended_unseen + other.ended_unseen,
            unobserved=self.unobserved + other.unobserved,
        )

    @property
    def empty(self) -> bool:
        return self == GapTally()


@dataclass
class GapPeriod:
    """The tallies of ``[start, end)`` per (job type, worker size), with the stored documents that could not be read."""

    start: dt.datetime
    end: dt.datetime
    tallies: dict[GapKey, GapTally] = field(default_factory=dict)
    malformed: int = 0

    def tally(self, key: GapKey) -> GapTally:
        return self.tallies.setdefault(key, GapTally())

    @property
    def gaps(self) -> int:
        return sum(tally.gaps.count for tally in self.tallies.values())


def combine_gaps(periods: Iterable[GapPeriod], start: dt.datetime, end: dt.datetime) -> GapPeriod:
    """The periods as one over ``[start, end)``: every count added."""
    combined = GapPeriod(start=start, end=end)
    for period in periods:
        combined.malformed += period.malformed
        for key, tally in period.tallies.items():
            combined.tallies[key] = combined.tally(key) + tally
    return combined
