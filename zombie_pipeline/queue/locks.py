"""The deployment's ``locks`` (2023-06 on): the lock a job's start takes, keyed by its ``unicity_id``, and its owner.

Its fields in each era, the time a lock is taken for, and the one write the cleanup makes to it: freeing the locks a
finish frees.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Set
from typing import Any, Final

from pymongo import UpdateMany
from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.jobs import ID

#: Which generation keeps it: ``generations.QueueGeneration.side_collections``.
LOCKS_COLLECTION = "locks"


class Lock:
    """Field names of ``locks`` (2023-06 on): ``_id`` is the lock's key, a job's ``unicity_id`` for its start."""

    OWNER: Final = "owner"
    TTL: Final = "ttl"
    JOB_ID: Final = "job_id"  # the owner's name before 2023-06-26
    CREATED_AT: Final = "created_at"
    UPDATED_AT: Final = "updated_at"


#: The fields of a lock document in each era (its key is its ``_id``); which era a generation is in: its table.
FIELDS_2023_06 = frozenset({Lock.JOB_ID, Lock.CREATED_AT, Lock.UPDATED_AT})
FIELDS_2023_07 = FIELDS_2023_06 | {Lock.OWNER}
FIELDS_2023_12 = FIELDS_2023_07 | {Lock.TTL}

#: The deployment's time-to-live of the lock a job's start takes, and of a git branch's lock (2023-12 on).
START_LOCK_TTL_SECONDS = 600
GIT_BRANCH_LOCK_TTL_SECONDS = 3_600


def release_locks(
    locks: Collection[Any],
    keys: Set[str],
    owners: Set[str],
    now: dt.datetime,
    session: ClientSession | None = None,
) -> None:
    """Free the locks keyed by ``keys`` and every lock ``owners`` hold, in one command.

    Only the owner field a lock document already has is written (early locks named it ``job_id``).
    """
    released = {Lock.UPDATED_AT: now}
    keyed = sorted(keys)
    operations = [
        UpdateMany({ID: {"$in": keyed}, Lock.OWNER: {"$exists": True}}, {"$set": {Lock.OWNER: None, **released}}),
        UpdateMany(
            {ID: {"$in": keyed}, Lock.JOB_ID: {"$ne": None}, Lock.OWNER: {"$exists": False}},
            {"$set": {Lock.JOB_ID: None, **released}},
        ),
    ]
    if owners:
        operations.append(UpdateMany({Lock.OWNER: {"$in": sorted(owners)}}, {"$set": {Lock.OWNER: None, **released}}))
    locks.bulk_write(operations, ordered=False, session=session)
