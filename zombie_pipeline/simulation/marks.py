"""The simulator's own marks in the databases it writes: which simulation they hold, who runs their workers."""

from __future__ import annotations

from typing import Final

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
