"""What every benchmark needs: counted clients, timed and traced calls, the machine.

* :class:`CommandCounter` is a ``pymongo.monitoring.CommandListener``: the
  commands a contender sends, the documents that come back in cursor batches,
  the documents the server says it wrote (``n`` of an insert or a delete,
  ``nModified`` plus the upserted of an update), and the BSON size of requests
  and replies. It is attached to a *dedicated* client, so loading data or
  asking for an ``explain`` is never counted.
* :func:`measure` runs a call once and returns its wall time, the CPU time of
  this process, its command counts and (optionally) the peak of Python
  allocations seen by ``tracemalloc``.
* :func:`spread` summarises repeated runs: median, quartiles, min and max.

Servers (a fresh one per run) and the delay proxy are in :mod:`benchmarks.servers`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import signal
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import bson
import pymongo
from pymongo import MongoClient, monitoring

from zombie_pipeline.cleanup.detection import query_plan_of

URL_ENV = "QUEUE_MONGO_URL"
#: Commands that write, and the reply field that says how many documents they wrote.
WRITE_COMMANDS = ("insert", "update", "delete")
MB = 1024 * 1024


# --- counting -----------------------------------------------------------------------


class CommandCounter(monitoring.CommandListener):
    """Counts what crosses the wire on the client it is attached to."""

    def __init__(self, measure_bytes: bool = True) -> None:
        self.measure_bytes = measure_bytes
        self.reset()

    def reset(self) -> None:
        self.commands: Counter = Counter()
        self.micros: Counter = Counter()  # round-trip time per command name, as pymongo measured it
        self._names: dict[int, str] = {}
        self._writes: dict[int, tuple[str, str]] = {}  # request id -> (collection, command)
        self.written: Counter = Counter()  # (collection, command) -> documents the server says it wrote
        self.write_commands = 0
        self.docs_returned = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.failed_commands = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands[event.command_name] += 1
        command = event.command
        target = command.get(event.command_name)
        collection = target if isinstance(target, str) else command.get("collection")
        self._names[event.request_id] = (
            f"{event.command_name} {collection}" if isinstance(collection, str) else event.command_name
        )
        if event.command_name in WRITE_COMMANDS and isinstance(collection, str):
            self._writes[event.request_id] = (collection, event.command_name)
            self.write_commands += 1
        if self.measure_bytes:
            self.bytes_sent += len(bson.encode(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.micros[self._names.pop(event.request_id, event.command_name)] += event.duration_micros
        reply = event.reply
        target = self._writes.pop(event.request_id, None)
        if target is not None:
            self.written[target] += documents_written(target[1], reply)
        cursor = reply.get("cursor") if isinstance(reply, dict) else None
        if isinstance(cursor, dict):
            batch = cursor.get("firstBatch", cursor.get("nextBatch")) or []
            self.docs_returned += sum(
                raw_documents(item) if isinstance(item, (bytes, bytearray, memoryview)) else 1 for item in batch
            )
        if self.measure_bytes:
            self.bytes_received += len(bson.encode(reply))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self.failed_commands += 1
        self._writes.pop(event.request_id, None)
        self.micros[self._names.pop(event.request_id, event.command_name)] += event.duration_micros

    @property
    def total(self) -> int:
        return sum(self.commands.values())

    @property
    def documents_written(self) -> int:
        return sum(self.written.values())

    def written_by_collection(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (collection, command), count in sorted(self.written.items()):
            out.setdefault(collection, {})[command] = count
        return out

    def snapshot(self) -> dict[str, Any]:
        return {
            "commands": self.total,
            "commands_by_name": dict(sorted(self.commands.items())),
            "write_commands": self.write_commands,
            "documents_written": self.documents_written,
            "written_by_collection": self.written_by_collection(),
            "docs_returned": self.docs_returned,
            "bytes_sent": self.bytes_sent if self.measure_bytes else None,
            "bytes_received": self.bytes_received if self.measure_bytes else None,
            "failed_commands": self.failed_commands,
            "round_trip_seconds_by_command": {
                name: round(micros / 1e6, 3) for name, micros in sorted(self.micros.items(), key=lambda item: -item[1])
            },
        }


def raw_documents(data: bytes | bytearray | memoryview) -> int:
    """Documents in a raw batch (``find_raw_batches``, pymongoarrow): BSON documents back to back, each
    starting with its int32 length; pymongo's event carries the whole batch as one ``bytes``."""
    view, count, offset = memoryview(data), 0, 0
    while offset + 4 <= len(view):
        offset += int.from_bytes(view[offset : offset + 4], "little")
        count += 1
    return count


def documents_written(command: str, reply: Any) -> int:
    """What the server's reply to a write command says it wrote (a failed document is not counted)."""
    if not isinstance(reply, dict):
        return 0
    if command == "update":
        return int(reply.get("nModified", 0)) + len(reply.get("upserted") or [])
    return int(reply.get("n", 0))


def new_client(url: str, counter: monitoring.CommandListener | None = None) -> MongoClient:
    """A client of its own (never the pipeline's cached one), tz-aware like the pipeline's."""
    listeners = [counter] if counter is not None else []
    return MongoClient(url, tz_aware=True, tzinfo=dt.UTC, event_listeners=listeners)


def drop_if_exists(client: MongoClient, *names: str) -> None:
    existing = set(client.list_database_names())
    for name in names:
        if name in existing:
            client.drop_database(name)


# --- measuring -----------------------------------------------------------------------


@dataclass
class Measurement:
    wall_seconds: float
    counts: dict[str, Any]
    peak_python_mb: float | None = None
    result: Any = None
    timed_out: bool = False
    error: str | None = None
    cpu_seconds: float = 0.0  # this process (the client side: our Python, pymongo's encoding and decoding)


def measure(
    call: Callable[[], Any],
    counter: CommandCounter | None = None,
    trace_memory: bool = False,
    cap_seconds: float | None = None,
) -> Measurement:
    """Run ``call`` once: wall time, CPU time of this process, commands, and the tracemalloc peak when asked.

    ``cap_seconds`` bounds every database operation of the call (pymongo's
    client-side timeout); a call that runs past it is reported as timed out.
    """
    if counter is not None:
        counter.reset()
    if trace_memory:
        tracemalloc.start()
        tracemalloc.reset_peak()
    timed_out, error, result = False, None, None
    cpu_started = time.process_time()
    started = time.perf_counter()
    try:
        with pymongo.timeout(cap_seconds) if cap_seconds else contextlib.nullcontext():
            result = call()
    except pymongo.errors.PyMongoError as exc:
        if not getattr(exc, "timeout", False):
            raise
        timed_out, error = True, f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    peak = None
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1] / MB
        tracemalloc.stop()
    counts = counter.snapshot() if counter is not None else {}
    return Measurement(wall, counts, peak, result, timed_out, error, cpu)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def present(value: float | None) -> float:
    """A figure a section always has (the median of its runs, a traced peak): never None where it is read."""
    assert value is not None
    return value


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    """Median, quartiles (``statistics.quantiles``, inclusive), min and max of repeated runs."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return {"n": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {
        "n": len(values),
        "median": round(statistics.median(values), digits),
        "q1": round(q1, digits),
        "q3": round(q3, digits),
        "min": round(values[0], digits),
        "max": round(values[-1], digits),
    }


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """A SIGTERM to the benchmark unwinds it (so the servers and proxies it started are stopped by their PIDs)."""

    def on_term(signum, frame):
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def server_version(url: str) -> str:
    client = new_client(url)
    try:
        return str(client.server_info().get("version", "?"))
    finally:
        client.close()


# --- explain ---------------------------------------------------------------------------


def explain_find(
    collection, query: dict, sort: dict | None = None, projection: dict | None = None, hint: list | None = None
) -> dict[str, Any]:
    """The plan the server chose for a find, with executionStats, summarised."""
    command: dict[str, Any] = {"find": collection.name, "filter": query}
    if hint:
        command["hint"] = dict(hint)
    if sort:
        command["sort"] = sort
    if projection:
        command["projection"] = projection
    return explain_command(collection.database, command)


def explain_aggregate(collection, pipeline: list[dict]) -> dict[str, Any]:
    """Like :func:`explain_find`, for an aggregation (the plan of its first, query stage)."""
    return explain_command(collection.database, {"aggregate": collection.name, "pipeline": pipeline, "cursor": {}})


def explain_command(database, command: dict) -> dict[str, Any]:
    """The summarised plan of any explainable command (``find``, ``aggregate``, ``distinct``, ``count``...)."""
    started = time.perf_counter()
    explained = database.command({"explain": command, "verbosity": "executionStats"})
    elapsed = time.perf_counter() - started
    planned = query_plan_of(explained)
    stats = planned.get("executionStats", {})
    return {
        "plan": plan_text(planned.get("queryPlanner", {}).get("winningPlan", {})),
        "docs_examined": stats.get("totalDocsExamined"),
        "keys_examined": stats.get("totalKeysExamined"),
        "returned": stats.get("nReturned"),
        "server_ms": stats.get("executionTimeMillis"),
        "explain_seconds": round(elapsed, 3),
    }


def plan_text(stage: dict[str, Any]) -> str:
    """``SORT <- FETCH <- IXSCAN(name)``; branches of OR stages in brackets."""
    if not isinstance(stage, dict) or not stage:
        return "?"
    if "queryPlan" in stage:  # newer servers wrap the plan
        stage = stage["queryPlan"]
    name = stage.get("stage", "?")
    if stage.get("indexName"):
        name += f"({stage['indexName']})"
    if "inputStage" in stage:
        return f"{name} <- {plan_text(stage['inputStage'])}"
    if "inputStages" in stage:
        return f"{name} <- [" + " | ".join(plan_text(s) for s in stage["inputStages"]) + "]"
    return name


# --- the machine -----------------------------------------------------------------------


def machine_info(embedded: bool, reported_version: str) -> dict[str, Any]:
    memory_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "nproc": os.cpu_count(),
        "memory_gib": memory_gib,
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pymongo": pymongo.version,
        "pandas": version("pandas"),
        "numpy": version("numpy"),
        "server": "SecantusDB (embedded, a fresh server per run, started by the benchmark)"
        if embedded
        else "external (QUEUE_MONGO_URL)",
        "server_version_reported": reported_version,
        "secantusdb": version("secantusdb") if embedded else None,
        "load_average_at_start": list(os.getloadavg()),
    }


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def python_command() -> str:
    return " ".join(["python", "-m", "benchmarks.run", *sys.argv[1:]])
