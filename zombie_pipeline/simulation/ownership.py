"""Which databases the simulator may drop or fill: empty ones, its own, or one its owner names.

A misdirected URL must meet a refusal, never a wipe: a simulation marks the
databases it writes, and anything else holding documents is left alone.
"""

from __future__ import annotations

from typing import Any

from pymongo.database import Database

from zombie_pipeline.queue.store import Store


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
    if store.simulated_generation() is not None:
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


def drop_simulation(store: Store, overwrite: str | None = None) -> None:
    """Drop the databases of a simulation (or of a database its owner named), after :func:`check_ours`."""
    check_ours(store, overwrite)
    for database in _databases(store):
        database.client.drop_database(database.name)
