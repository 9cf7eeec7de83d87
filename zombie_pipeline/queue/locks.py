"""The deployment's ``locks`` (2023-06 on): the lock a job's start takes, keyed by its ``unicity_id``, and its owner."""

from __future__ import annotations

from typing import Final

#: Which generation keeps it: ``generations.QueueGeneration.side_collections``.
LOCKS_COLLECTION = "locks"


class Lock:
    """Field names of ``locks`` (2023-06 on): ``_id`` is the lock's key, a job's ``unicity_id`` for its start."""

    OWNER: Final = "owner"
    TTL: Final = "ttl"
    JOB_ID: Final = "job_id"  # the owner's name before 2023-06-26
    CREATED_AT: Final = "created_at"
    UPDATED_AT: Final = "updated_at"
