"""One cleanup in a process of its own: ``run_cleanup`` with the brake overridden, as the scenario asks.

Arguments: ``url``, ``queue``, ``cache``, ``policy`` (fields of ``ZombiePolicy``),
``run_id``; optional ``now`` (ISO date: detection's instant), ``go_at`` (epoch
seconds to wait for, so that several cleanups start together) and
``job_types``. Says ``started`` at once (a scenario may SIGKILL it any time
after), and reports as its last line what it did and what its writes changed,
per collection, from the server's replies.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time

from pymongo import MongoClient, monitoring

from zombie_pipeline.cleanup.run import run_cleanup
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.store import Document, Store


class Writes(monitoring.CommandListener):
    """What this process's writes changed, per collection, from the server's replies."""

    def __init__(self) -> None:
        self.requests: dict[int, tuple[str, str | None]] = {}
        self.totals: dict[str, dict[str, int]] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("update", "insert", "delete"):
            self.requests[event.request_id] = (event.command_name, event.command.get(event.command_name))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        name = self.requests.pop(event.request_id, None)
        if name is None:
            return
        reply = event.reply
        totals = self.totals.setdefault(f"{name[0]}:{name[1]}", {"commands": 0, "n": 0, "nModified": 0, "upserted": 0})
        totals["commands"] += 1
        totals["n"] += reply.get("n", 0)
        totals["nModified"] += reply.get("nModified", 0)
        totals["upserted"] += len(reply.get("upserted", []))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.requests.pop(event.request_id, None)


def main(args: dict) -> dict:
    writes = Writes()
    client: MongoClient[Document] = MongoClient(args["url"], tz_aware=True, tzinfo=dt.UTC, event_listeners=[writes])
    store = Store.of(client[args["queue"]], client[args["cache"]])
    policy = ZombiePolicy(**args["policy"])
    now = dt.datetime.fromisoformat(args["now"]) if args.get("now") else None
    print("started", flush=True)
    while time.time() < args.get("go_at", 0):
        time.sleep(0.005)
    started = time.monotonic()
    report = run_cleanup(store, policy, args["run_id"], now=now, job_types=args.get("job_types"), override_brake=True)
    return {
        "run_id": args["run_id"],
        "seconds": round(time.monotonic() - started, 2),
        "counts": {name: count for name, count in report.counts.items() if not name.startswith("type:")},
        "reconciled": dict(report.reconciled.counts),
        "won": [row["job_id"] for row in report.steps.rows],
        "writes": writes.totals,
    }


if __name__ == "__main__":
    with open(sys.argv[1]) as arguments:
        print(json.dumps(main(json.load(arguments))), flush=True)
