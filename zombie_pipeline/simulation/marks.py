"""The simulator's own marks in the databases it writes: which simulation they hold, who runs their workers."""

from __future__ import annotations

from typing import Final

from pymongo.collection import Collection

from zombie_pipeline.queue.jobs import ID
from zombie_pipeline.queue.store import Document, Store

#: Written by the simulator: the proof that a database's documents are ours to drop or fill.
SIMULATIONS_COLLECTION = "zombieSimulations"


class SimulationMark:
    """Field names of ``zombieSimulations``: one document per simulation written in these databases."""

    GENERATION: Final = "generation"
    SEED: Final = "seed"
    AT: Final = "at"


#: Written by the simulated workers while they run: the one process of them a simulated queue has.
SIMULATED_WORKERS_COLLECTION = "zombieSimulatedWorkers"


class WorkersClaim:
    """Field names of ``zombieSimulatedWorkers``: which process runs a simulated queue's workers, renewed meanwhile."""

    OWNER = "owner"
    PID = "pid"
    HOST = "host"
    STARTED_AT = "started_at"
    RENEWED_AT = "renewed_at"


def marks(store: Store) -> Collection[Document]:
    """``zombieSimulations`` beside the queue these databases hold."""
    return store.beside_queue(SIMULATIONS_COLLECTION)


def simulated_generation(store: Store) -> str | None:
    """The queue generation the simulator wrote these databases in (its latest mark), or None when it wrote none: a
    simulated queue is the simulator's to drop, its healthy jobs alive only while its simulated workers run."""
    marker = marks(store).find_one(sort=[(ID, -1)])
    return str(marker[SimulationMark.GENERATION]) if marker else None


def simulation_id(store: Store) -> str | None:
    """Which simulation these databases hold: the ``_id`` of the first mark since they were last dropped (later
    simulations add to it), or None where the simulator wrote nothing (a deployment's databases)."""
    marker = marks(store).find_one(sort=[(ID, 1)], projection={ID: 1})
    return str(marker[ID]) if marker else None
