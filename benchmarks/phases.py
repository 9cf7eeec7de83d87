"""Where a cleanup's server time goes: every command of one run, its server-side duration, by phase.

One contender (ours: ``run_cleanup``, or the 2023 baseline) on a fresh embedded
server holding a cleanup case's data (:mod:`benchmarks.servers`, the same
templates as the cleanup section). A ``CommandListener`` on the contender's own
client records each command's ``duration_micros`` (at RTT 0 on 127.0.0.1,
nearly all of it the server's work), the documents the server says it wrote,
and the phase of the cleanup that sent it, told from the Python stack at the
moment the command starts (the innermost function of the pipeline it is in).

    python -m benchmarks.phases build DIR                  # the case's template into DIR (once)
    python -m benchmarks.phases run DIR [--baseline] [--package-root ROOT] [--json OUT]

``--package-root`` puts another copy of ``zombie_pipeline`` first on the path
(e.g. an older version exported with ``git archive``), so that two versions
run the same script on the same data.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

from pymongo import monitoring

#: Innermost pipeline function -> phase. The first function of the stack (innermost first) found here names it.
PHASES = {
    "detect_queue_generation": "queue generation",
    "ensure_indexes": "indexes",
    "take_over_expired": "reconcile: take over",
    "enqueue_due_retries": "reconcile: due retries",
    "detect": "detection",
    "find_malformed_started": "detection: malformed",
    "brake_for": "detection: brake count",
    "claim": "claim insert",
    "renew_leases": "lease renewal",
    "owned": "event batch read",
    "reconcile": "event generations",
    "detect_cache_generation": "cache generation",
    "sort_claims": "claims sorted (job read)",
    "_still_our_entries": "our entries read",
    "_jobs_of": "job read-back",
    "of": "the deployment's collections",
    "entries_of_jobs": "cache read",
    "_write": "cache write",
    "_count_in_cache_metrics": "cache metrics",
    "write_batch": "cache read-back",
    "after_insert": "retry: deployment's counters",
    "after_finish": "finish: deployment's collections",
    "_queued_unicity_ids": "retry: unicity read",
    "enqueue_retries": "retry insert",
    "set_on_events": "events completion",
    "finish": "job compare-and-set",
    "complete": "lost claims deleted",
    "compensate": "compensations",
    "kill_zombies_2023": "baseline",
}


def _phase(frames: list[tuple[str, str]]) -> str:
    for filename, function in frames:
        if ("zombie_pipeline" in filename or "baseline_2023" in filename) and function in PHASES:
            return PHASES[function]
    return "other"


class PhaseLog(monitoring.CommandListener):
    """A ``CommandListener``: each command's phase, name, collection, server duration and documents written."""

    def __init__(self) -> None:
        self.started_at: dict[int, dict[str, Any]] = {}
        self.commands: list[dict[str, Any]] = []

    def started(self, event: Any) -> None:
        frames = [(frame.f_code.co_filename, frame.f_code.co_name) for frame in _stack()]
        command = event.command
        target = command.get(event.command_name)
        statements = len(command.get("updates") or command.get("deletes") or command.get("documents") or [])
        self.started_at[event.request_id] = {
            "phase": _phase(frames),
            "command": event.command_name,
            "collection": target if isinstance(target, str) else None,
            "statements": statements,
        }

    def succeeded(self, event: Any) -> None:
        from benchmarks.harness import documents_written

        row = self.started_at.pop(event.request_id, None)
        if row is None:
            return
        row["micros"] = event.duration_micros
        row["written"] = (
            documents_written(row["command"], event.reply) if row["command"] in ("insert", "update", "delete") else 0
        )
        cursor = event.reply.get("cursor") if isinstance(event.reply, dict) else None
        row["returned"] = (
            len((cursor or {}).get("firstBatch", (cursor or {}).get("nextBatch")) or [])
            if isinstance(cursor, dict)
            else 0
        )
        self.commands.append(row)

    def failed(self, event: Any) -> None:
        row = self.started_at.pop(event.request_id, None)
        if row is not None:
            row.update(micros=event.duration_micros, written=0, returned=0, failed=True)
            self.commands.append(row)


def _stack() -> list[Any]:
    frame: FrameType | None = sys._getframe(2)
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def by_phase(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(
        lambda: {"commands": 0, "micros": 0, "written": 0, "returned": 0, "statements": 0}
    )
    for row in commands:
        group = groups[(row["phase"], row["command"], row["collection"] or "")]
        group["commands"] += 1
        group["micros"] += row["micros"]
        group["written"] += row["written"]
        group["returned"] += row["returned"]
        group["statements"] += row["statements"]
    rows = [
        {"phase": phase, "command": command, "collection": collection, **values}
        for (phase, command, collection), values in groups.items()
    ]
    return sorted(rows, key=lambda row: -row["micros"])


def build(directory: Path, case_text: str) -> None:
    from benchmarks.cleanup_bench import CleanupCase, case_template
    from benchmarks.servers import Servers

    directory.mkdir(parents=True, exist_ok=True)
    servers = Servers(None, workdir=directory)
    template = case_template(servers, CleanupCase.parse(case_text), print)
    (directory / "template.pickle").write_bytes(pickle.dumps(template.__dict__ | {"build": None}))


def run(directory: Path, baseline: bool, batch_size: int) -> dict[str, Any]:
    from benchmarks.cleanup_bench import BASELINE, OURS, benchmark_policy, contenders
    from benchmarks.harness import new_client
    from benchmarks.servers import Servers, Template
    from zombie_pipeline.queue.jobs import Job, Status
    from zombie_pipeline.queue.store import Store

    fields = pickle.loads((directory / "template.pickle").read_bytes())
    template = Template(**{**fields, "build": lambda *_: {}})
    servers = Servers(None, workdir=directory / "runs", log=lambda _: None)
    servers._owns_workdir = True
    (directory / "runs").mkdir(exist_ok=True)
    call = contenders(benchmark_policy(batch_size))[BASELINE if baseline else OURS]
    log = PhaseLog()
    try:
        with servers.fresh(template) as running:
            client = new_client(running.url, log)
            try:
                client.admin.command("ping")
                store = Store.of(client[template.queue_db], client[template.cache_db])
                cpu_before = running.cpu_seconds()
                started = time.perf_counter()
                finalized = call(store, template.facts["now"])
                wall = time.perf_counter() - started
                cpu_after = running.cpu_seconds()
                assert cpu_before is not None and cpu_after is not None  # the embedded server's
                cpu = cpu_after - cpu_before
                left = store.jobs.count_documents({Job.STATUS: Status.STARTED})
            finally:
                client.close()
    finally:
        servers.close()
    import zombie_pipeline

    return {
        "contender": BASELINE if baseline else OURS,
        "package": str(Path(zombie_pipeline.__file__).parent),
        "wall_seconds": round(wall, 3),
        "server_cpu_seconds": round(cpu, 3),
        "server_micros": sum(row["micros"] for row in log.commands),
        "finalized": finalized,
        "started_left": left,
        "expected_started_left": template.facts["started"] - template.facts["zombies"],
        "phases": by_phase(log.commands),
        "commands": log.commands,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "run"))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--case", default="2023-01:10000:1000:30")
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.action == "build":
        build(args.directory, args.case)
        return
    result = run(args.directory, args.baseline, args.batch_size)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(
        f"{result['contender']} ({result['package']}): wall {result['wall_seconds']:.2f} s, server CPU {result['server_cpu_seconds']:.2f} s, "
        f"commands' server time {result['server_micros'] / 1e6:.2f} s, finalized {result['finalized']}, started left "
        f"{result['started_left']} (expected {result['expected_started_left']})"
    )
    print(
        f"{'phase':38} {'command':8} {'collection':18} {'cmds':>5} {'stmts':>6} {'written':>7} {'returned':>8} {'ms':>9} {'ms/written':>10}"
    )
    for row in result["phases"]:
        per = f"{row['micros'] / 1000 / row['written']:.2f}" if row["written"] else ""
        print(
            f"{row['phase']:38} {row['command']:8} {row['collection'][:18]:18} {row['commands']:5} {row['statements']:6} "
            f"{row['written']:7} {row['returned']:8} {row['micros'] / 1000:9.1f} {per:>10}"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if "--package-root" in sys.argv:
        index = sys.argv.index("--package-root")
        sys.path.insert(0, sys.argv[index + 1])
        del sys.argv[index : index + 2]
    main()
