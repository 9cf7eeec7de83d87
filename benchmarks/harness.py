"""What every benchmark needs: a server, counted clients, timed and traced calls.

* :func:`server` yields a MongoDB URL: ``QUEUE_MONGO_URL`` when set, else a
  SecantusDB server started here on a free port, in a temporary directory,
  and stopped (by its PID) when the block ends.
* :class:`CommandCounter` is a ``pymongo.monitoring.CommandListener``: the
  commands a contender sends, the documents that come back in cursor batches,
  and the BSON size of requests and replies. It is attached to a *dedicated*
  client, so loading data or asking for an ``explain`` is never counted.
* :func:`measure` runs a call once and returns its wall time, its command
  counts and (optionally) the peak of Python allocations seen by ``tracemalloc``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

import bson
import pymongo
from pymongo import MongoClient, monitoring

from zombie_pipeline.detection import query_plan_of

URL_ENV = "QUEUE_MONGO_URL"
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
        self.docs_returned = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.failed_commands = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands[event.command_name] += 1
        command = event.command
        target = command.get(event.command_name)
        collection = target if isinstance(target, str) else command.get("collection")
        self._names[event.request_id] = f"{event.command_name} {collection}" if isinstance(collection, str) else event.command_name
        if self.measure_bytes:
            self.bytes_sent += len(bson.encode(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self.micros[self._names.pop(event.request_id, event.command_name)] += event.duration_micros
        reply = event.reply
        cursor = reply.get("cursor") if isinstance(reply, dict) else None
        if isinstance(cursor, dict):
            batch = cursor.get("firstBatch", cursor.get("nextBatch")) or []
            self.docs_returned += len(batch)
        if self.measure_bytes:
            self.bytes_received += len(bson.encode(reply))

    def failed(self, event: monitoring.CommandFailedEvent) -> None:  # type: ignore[override]
        self.failed_commands += 1
        self.micros[self._names.pop(event.request_id, event.command_name)] += event.duration_micros

    @property
    def total(self) -> int:
        return sum(self.commands.values())

    def snapshot(self) -> dict[str, Any]:
        return {
            "commands": self.total,
            "commands_by_name": dict(sorted(self.commands.items())),
            "docs_returned": self.docs_returned,
            "bytes_sent": self.bytes_sent if self.measure_bytes else None,
            "bytes_received": self.bytes_received if self.measure_bytes else None,
            "failed_commands": self.failed_commands,
            "round_trip_seconds_by_command": {
                name: round(micros / 1e6, 3) for name, micros in sorted(self.micros.items(), key=lambda item: -item[1])
            },
        }


def new_client(url: str, counter: CommandCounter | None = None) -> MongoClient:
    """A client of its own (never the pipeline's cached one), tz-aware like the pipeline's."""
    listeners = [counter] if counter is not None else []
    return MongoClient(url, tz_aware=True, tzinfo=dt.timezone.utc, event_listeners=listeners)


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


def measure(
    call: Callable[[], Any],
    counter: CommandCounter | None = None,
    trace_memory: bool = False,
    cap_seconds: float | None = None,
) -> Measurement:
    """Run ``call`` once: wall time, commands, and the tracemalloc peak when asked.

    ``cap_seconds`` bounds every database operation of the call (pymongo's
    client-side timeout); a call that runs past it is reported as timed out.
    """
    if counter is not None:
        counter.reset()
    if trace_memory:
        tracemalloc.start()
        tracemalloc.reset_peak()
    timed_out, error, result = False, None, None
    started = time.perf_counter()
    try:
        with pymongo.timeout(cap_seconds) if cap_seconds else contextlib.nullcontext():
            result = call()
    except pymongo.errors.PyMongoError as exc:
        if not getattr(exc, "timeout", False):
            raise
        timed_out, error = True, f"{type(exc).__name__}: {str(exc)[:200]}"
    wall = time.perf_counter() - started
    peak = None
    if trace_memory:
        peak = tracemalloc.get_traced_memory()[1] / MB
        tracemalloc.stop()
    counts = counter.snapshot() if counter is not None else {}
    return Measurement(wall, counts, peak, result, timed_out, error)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# --- the server ------------------------------------------------------------------------


@dataclass
class ServerHandle:
    url: str
    embedded: bool
    pid: int | None = None
    storage_path: str | None = None
    version: str = "?"
    notes: list[str] = field(default_factory=list)

    def rss_mb(self) -> float | None:
        """Resident memory of the embedded server (None for an external one)."""
        if self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def cpu_seconds(self) -> float | None:
        if self.pid is None:
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def wait_idle(self, quiet_share: float = 0.15, window: float = 2.0, limit_seconds: float = 900.0) -> float:
        """Wait until the embedded server uses under ``quiet_share`` of a core (after a client timeout
        the server may still be working on the abandoned command). Returns the seconds waited."""
        if self.pid is None:
            return 0.0
        started = time.monotonic()
        while time.monotonic() - started < limit_seconds:
            before = self.cpu_seconds()
            time.sleep(window)
            after = self.cpu_seconds()
            if before is None or after is None or (after - before) / window < quiet_share:
                break
        return time.monotonic() - started


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


@contextlib.contextmanager
def server(url: str | None = None, keep_storage: bool = False, log: Callable[[str], None] = print) -> Iterator[ServerHandle]:
    """``url``, else ``QUEUE_MONGO_URL``, else an embedded SecantusDB started (and stopped) here."""
    url = url or os.environ.get(URL_ENV)
    if url:
        handle = ServerHandle(url=url, embedded=False)
        handle.version = _server_version(url)
        yield handle
        return
    from zombie_pipeline.embedded import start_server

    base = Path(tempfile.mkdtemp(prefix="zp-bench-"))
    process, info = start_server(base / "data", log_path=base / "server.log", detach=False)
    handle = ServerHandle(url=info.url, embedded=True, pid=process.pid, storage_path=str(base))
    log(f"started SecantusDB pid {process.pid} on {info.url} (storage {base})")
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):  # stop our server when the benchmark is stopped by PID
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)
    try:
        handle.version = _server_version(info.url)
        yield handle
    finally:
        _stop(process)
        signal.signal(signal.SIGTERM, previous)
        log(f"stopped SecantusDB pid {process.pid}")
        if not keep_storage:
            shutil.rmtree(base, ignore_errors=True)


def _server_version(url: str) -> str:
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


def machine_info(handle: ServerHandle) -> dict[str, Any]:
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
        "server": "SecantusDB (embedded, started by the benchmark)" if handle.embedded else "external (QUEUE_MONGO_URL)",
        "server_version_reported": handle.version,
        "secantusdb": version("secantusdb") if handle.embedded else None,
        "load_average_at_start": list(os.getloadavg()),
    }


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def python_command() -> str:
    return " ".join(["python", "-m", "benchmarks.run", *sys.argv[1:]])
