"""Live workers, as a datasets-server worker writes: heartbeats every round, then the response, then the finish.

Deliberately written with the deployment's own field and collection names, not
with ``zombie_pipeline``'s vocabulary: it stands for another program writing to
the same queue. Some healthy jobs finish every round once ``go_at`` has come;
each "revived" zombie's worker comes back at a random moment of
``spread_seconds`` and finishes it, racing the cleanups. Stops when
``stop_file`` exists, finishing the revived jobs not yet due.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import sys
import time
from typing import Any

from bson import ObjectId
from pymongo import MongoClient, ReplaceOne, UpdateOne


def now() -> dt.datetime:
    moment = dt.datetime.now(dt.UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def key_of(job: dict) -> dict:
    return {"kind": job["type"], "dataset": job["dataset"], "config": job.get("config"), "split": job.get("split")}


def main(args: dict) -> dict:
    client: MongoClient[dict[str, Any]] = MongoClient(args["url"], tz_aware=True, tzinfo=dt.UTC)
    jobs = client[args["queue"]]["jobsBlue"]
    cache = client[args["cache"]]["cachedResponsesBlue"]
    rng = random.Random(args["seed"])

    def load(ids: list[str]) -> dict:
        return {job["_id"]: job for job in jobs.find({"_id": {"$in": [ObjectId(i) for i in ids]}})}

    healthy = load(args["healthy"])
    revived = load(args["revived"])
    unfinished = set(healthy)
    report: dict[str, Any] = {
        "beat_rounds": 0,
        "beats": 0,
        "healthy_finished": 0,
        "healthy_finish_refused": 0,
        "revived_worker_won": 0,
        "revived_cleanup_won": 0,
        "success_writes": [],
    }

    def finish(batch: list[dict]) -> set:
        """As a datasets-server worker does: write the response, then mark the job finished."""
        stamp = now()
        operations = []
        for job in batch:
            key = key_of(job)
            entry = {
                **{k: v for k, v in key.items() if v is not None},
                "http_status": 200,
                "error_code": None,
                "content": {"result": "ok", "job_id": str(job["_id"])},
                "details": {},
                "job_runner_version": 2,
                "dataset_git_revision": "live",
                "progress": 1.0,
                "updated_at": stamp,
                "duration": 1.0,
                "failed_runs": 0,
            }
            operations.append(ReplaceOne(key, {k: v for k, v in entry.items() if v is not None}, upsert=True))
            report["success_writes"].append(str(job["_id"]))
        cache.bulk_write(operations, ordered=False)
        jobs.bulk_write(
            [
                UpdateOne(
                    {"_id": job["_id"], "status": "started"}, {"$set": {"status": "success", "finished_at": stamp}}
                )
                for job in batch
            ],
            ordered=False,
        )
        ids = [job["_id"] for job in batch]
        return {job["_id"] for job in jobs.find({"_id": {"$in": ids}, "status": "success"}, {"_id": 1})}

    def finish_revived(due: list) -> None:
        done = finish([revived[job_id] for job_id in due])
        report["revived_worker_won"] += len(done)
        report["revived_cleanup_won"] += len(due) - len(done)

    go = args["go_at"]
    schedule = sorted((go + rng.uniform(0, args["spread_seconds"]), job_id) for job_id in revived)
    print("ready", flush=True)
    while not os.path.exists(args["stop_file"]):
        if unfinished:
            beat = jobs.update_many(
                {"_id": {"$in": list(unfinished)}, "status": "started"}, {"$set": {"last_heartbeat": now()}}
            )
            report["beat_rounds"] += 1
            report["beats"] += beat.modified_count
            if time.time() >= go:
                count = max(1, int(len(unfinished) * args["finish_fraction"]))
                batch = [healthy[i] for i in rng.sample(sorted(unfinished), min(count, len(unfinished)))]
                done = finish(batch)
                report["healthy_finished"] += len(done)
                report["healthy_finish_refused"] += len(batch) - len(done)
                unfinished -= {job["_id"] for job in batch}
        due = [job_id for at, job_id in schedule if at <= time.time()]
        if due:
            schedule = [(at, job_id) for at, job_id in schedule if job_id not in due]
            finish_revived(due)
        time.sleep(args["pause"])
    left = [job_id for _, job_id in schedule]
    if left:
        finish_revived(left)
    report["healthy_unfinished"] = len(unfinished)
    return report


if __name__ == "__main__":
    with open(sys.argv[1]) as arguments:
        print(json.dumps(main(json.load(arguments))), flush=True)
