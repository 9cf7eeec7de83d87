"""Where a period's durations come from: the finished jobs where the queue keeps them, else the cache.

The queue's generation says which (``QueueGeneration.durations_source``); everything the statistics read
is chosen here, and nowhere else.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from zombie_pipeline.queue.generations import DurationsSource, QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.statistics.cache_source import read_cache_period
from zombie_pipeline.statistics.jobs_source import count_undated_jobs, read_period
from zombie_pipeline.statistics.tallies import READ_BATCH_SIZE, Period


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


def left_out_of_every_day(store: Store, generation: QueueGeneration) -> Counter[Any] | None:
    """Documents no day can hold, counted over the whole collection: where finished jobs are the source,
    jobs without a usable ``finished_at`` or of a status the generation does not declare; else none."""
    if generation.durations_source is DurationsSource.FINISHED_JOBS:
        return count_undated_jobs(store.jobs, generation)
    return None
