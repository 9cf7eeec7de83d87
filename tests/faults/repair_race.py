"""How a counter repair races the deployment's live workers: measured, not assumed.

A worker moves a counter in two writes (its job, then the ``$inc``); a repair
reads the counters, counts the documents, and writes the difference. Simulated
workers (``simulation.workers``: starts, heartbeats, finishes, new waiting jobs,
each with the deployment's counter moves, in one thread) keep every counter in
step by themselves. In another thread, one repair of every ``jobTotalMetric``
key they touch and of the worker sizes, at a random moment; then the workers
are paused between two of their steps (none is half done), and every counter
is compared with its recount: whatever is off, that one repair left off. Again
and again, in one of two ways:

- ``compare_and_set``: what ``counters.repair`` does (read, count, compare-and-set,
  again until a round finds nothing to write);
- ``recount_set``: every counter set to a recount as it is (``counters.write_recount``,
  as the deployment's own periodic recount writes them).

``python -m tests.faults.repair_race [REPAIRS]`` prints both on a server of its
own; ``test_database_faults.py`` runs a short version.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.faults.scenario import connect, counters_off
from tests.servers import running_server
from zombie_pipeline.cleanup import counters
from zombie_pipeline.cleanup.counters import CountersInDoubt
from zombie_pipeline.cleanup.side_collections import SideCollections
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import JOB_TYPES, Workload

GENERATION = QUEUE_GENERATIONS["2026-05"]
#: Busy workers: jobs of a second or two, the waiting jobs topped up at once.
RATES = WorkerRates(
    workers=8,
    crashes_per_worker_hour=0.0,
    overruns_per_worker_hour=0.0,
    speed=0.002,
    heartbeat_seconds=1.0,
    waiting_target=30,
)


class _Workers(threading.Thread):
    """The pool ticking as fast as the server lets it, pausable between two ticks."""

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__(daemon=True)
        self.pool = pool
        self.running = threading.Event()
        self.running.set()
        self.idle = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.05)
                continue
            self.idle.clear()
            self.pool.tick()

    def pause(self) -> None:
        self.running.clear()
        self.idle.wait()

    def resume(self) -> None:
        self.idle.clear()
        self.running.set()


def measure(store: Store, repairs: int, recount_set: bool, seed: int = 0) -> dict[str, Any]:
    """``repairs`` single repairs amid the workers; after each, how far it left the counters from their recount."""
    simulate(
        store,
        Workload(finished=0, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=30, seed=seed),
        now=dt.datetime.now(dt.UTC),
    )
    pool = WorkerPool(store, GENERATION, ZombiePolicy(), RATES, seed=seed)
    doubt = CountersInDoubt(
        job_metrics={(job_type.name, status) for job_type in JOB_TYPES for status in (Status.WAITING, Status.STARTED)},
        worker_sizes=True,
    )
    side = SideCollections.of(store, GENERATION)  # the cleanup's view of the collections the workers keep
    rng = random.Random(seed)
    workers = _Workers(pool)
    left_off: Counter = Counter()
    corrected = 0
    try:
        workers.start()
        for _ in range(repairs):
            time.sleep(rng.uniform(0.0, 0.2))
            if recount_set:
                counters.write_recount(store, GENERATION)
            else:
                corrected += counters.repair(store, side, doubt)
            workers.pause()
            off = sum(counters_off(store, GENERATION).values())
            left_off[off] += 1
            if off:  # set right while nothing moves, so that the next repair starts from exact counters
                counters.repair(store, side, doubt)
            workers.resume()
    finally:
        workers.done.set()
        workers.resume()
        workers.join()
        pool.stop()
    return {
        "way": "recount_set" if recount_set else "compare_and_set",
        "repairs": repairs,
        "worker_moves": dict(pool.counts),
        "counters_written_by_the_repairs": corrected,
        "repairs_that_left_a_counter_off": repairs - left_off[0],
        "counters_off_after_a_repair": dict(sorted(left_off.items())),
    }


def main(repairs: int = 100) -> list[dict[str, Any]]:
    results = []
    with running_server(Path(tempfile.mkdtemp(prefix="repair-race-"))) as server:
        client = connect(server.url)
        for recount_set in (False, True):
            name = "set" if recount_set else "cas"
            started = time.monotonic()
            results.append(measure(Store.of(client[f"q_{name}"], client[f"c_{name}"]), repairs, recount_set))
            results[-1]["wall_seconds"] = round(time.monotonic() - started, 1)
    return results


if __name__ == "__main__":
    for result in main(int(sys.argv[1]) if len(sys.argv) > 1 else 100):
        print(json.dumps(result, default=str))
