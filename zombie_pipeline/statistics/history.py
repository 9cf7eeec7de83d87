"""Where a period's durations come from: the finished jobs where the queue keeps them, else the cache."""

from __future__ import annotations

import datetime as dt

from zombie_pipeline.queue.generations import DurationsSource, QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.statistics.cache_history import read_cache_period
from zombie_pipeline.statistics.tallies import READ_BATCH_SIZE, Period, read_period


def read_history(
    store: Store,
    generation: QueueGeneration,
    start: dt.datetime,
    end: dt.datetime,
    batch_size: int = READ_BATCH_SIZE,
    create_cache_index: bool = False,
) -> Period:
    """The tallies of ``[start, end)`` from the source ``generation`` leaves: jobs (of the statuses it declares),
    or cache entries."""
    if generation.durations_source is DurationsSource.FINISHED_JOBS:
        return read_period(store.jobs, store.events, start, end, batch_size, generation)
    return read_cache_period(store.cache, store.events, start, end, batch_size, create_cache_index)
