"""Which databases the simulator may drop or fill: empty ones, its own, or one its owner names.

A misdirected URL must meet a refusal, never a wipe: a simulation marks the
databases it writes, and anything else holding documents is left alone. A
simulation is dropped only once the server has taken a write, and its marker
goes last: a drop cut short leaves a simulation that is still known as ours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymongo.database import Database

from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.marks import SIMULATIONS_COLLECTION, simulated_generation

#: Documents deleted per command when a simulation is dropped, a range of ``_id``: about 1 s on the embedded server
#: beside other work (cache entries and their four indexes), well within its timeout.
DROP_BATCH_SIZE = 1_000
#: The document a write probe inserts and deletes again, in the marker collection.
WRITE_PROBE_ID = "write-probe"


class NotOurs(RuntimeError):
    """A database holds documents the simulator did not write: it is never dropped nor filled."""


def _databases(store: Store) -> list[Database[Any]]:
    queue, cache = store.jobs.database, store.cache.database
    return [queue] if (queue.name, queue.client) == (cache.name, cache.client) else [queue, cache]


#: How a person gives a database up to the simulator, as ``zombie-pipeline simulate`` takes it ({name}: the database).
GIVE_UP_WITH_SIMULATE = "If it is a scratch database you own, say so: --overwrite-database {name}."


def check_ours(store: Store, overwrite: str | None = None, give_up: str = GIVE_UP_WITH_SIMULATE) -> None:
    """Refuse a database that holds documents the simulator did not write, unless its owner names it.

    Ours: empty, or marked by an earlier simulation. ``overwrite`` is the name of
    the one database the operator deliberately gives up; ``give_up`` says how, in the words of the command
    that asks (``{name}``: the database's name).
    """
    if simulated_generation(store) is not None:
        return
    for database in _databases(store):
        if overwrite == database.name:
            continue
        holding = {name: database[name].estimated_document_count() for name in database.list_collection_names()}
        holding = {name: count for name, count in holding.items() if count}
        if holding:
            listed = ", ".join(f"{name} ({count})" for name, count in sorted(holding.items()))
            raise NotOurs(
                f"database {database.name!r} holds documents zombie-pipeline did not write: {listed}. Refusing to drop "
                f"or fill it. " + give_up.format(name=database.name)
            )


def check_writable(store: Store, progress: Callable[[str], None] = lambda doing: None) -> None:
    """Write to each database (a probe in the marker collection, deleted at once): before anything is dropped, the
    server has shown it takes writes within the timeout. A database error says so (nothing dropped yet)."""
    for database in _databases(store):
        progress(f"checking that {database.name} takes writes")
        probes = database[SIMULATIONS_COLLECTION]
        probes.replace_one({ID: WRITE_PROBE_ID}, {ID: WRITE_PROBE_ID}, upsert=True)
        probes.delete_one({ID: WRITE_PROBE_ID})


def drop_simulation(
    store: Store, overwrite: str | None = None, progress: Callable[[str], None] = lambda doing: None
) -> None:
    """Drop the databases of a simulation (or of a database its owner named), after :func:`check_ours` and
    :func:`check_writable`; ``progress`` is told what it does, for an error to name it.

    Emptied a range of ``_id`` at a time, then dropped: the embedded server drops a collection of 2,000 documents in
    7 to 12 s and more under load (past its timeout beside other work: the databases were gone, the command failed),
    and deletes them in 1 to 2 s (a list of ``_id`` costs it more the longer it is: 500 took 4 s). The marker
    collection goes last.
    """
    check_ours(store, overwrite)
    check_writable(store, progress)
    databases = _databases(store)
    collections = [database[name] for database in databases for name in database.list_collection_names()]
    for collection in sorted(collections, key=lambda collection: collection.name == SIMULATIONS_COLLECTION):
        progress(f"dropping the simulation: deleting {collection.full_name}, {DROP_BATCH_SIZE} documents at a time")
        while bound := next(collection.find({}, {ID: 1}).sort(ID, 1).skip(DROP_BATCH_SIZE - 1).limit(1), None):
            collection.delete_many({ID: {"$lte": bound[ID]}})  # the bound's own type at least: each pass deletes some
        collection.delete_many({})
    for database in databases:
        progress(f"dropping the simulation: dropping {database.name}, emptied")
        database.client.drop_database(database.name)
